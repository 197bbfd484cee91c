import re

from josef_console.charts import format_rate, points, sparkline


def test_points_span_the_width_and_scale_from_zero_to_the_peak():
    drawn = points([0, 5, 10], width=100, height=22)
    assert [x for x, _ in drawn] == [0, 50, 100]
    assert drawn[0][1] == 20  # zero sits on the bottom, above the padding
    assert drawn[2][1] == 2  # the peak touches the top, below the padding
    assert drawn[1][1] == 11


def test_no_activity_is_a_flat_line_at_the_bottom_and_one_sample_a_flat_line_across():
    assert points([0, 0], 10, 10) == [(0, 8), (10, 8)]
    assert points([7], 10, 10) == [(0, 2), (10, 2)]
    assert points([], 10, 10) == []


def test_a_sparkline_is_inline_svg_without_style_attributes_or_external_references():
    svg = sparkline([1.0, 4.0, 2.5], "orders <records>/s")
    assert svg.startswith('<svg class="spark"') and svg.endswith("</svg>")
    assert "style=" not in svg  # the console's Content-Security-Policy allows no inline style
    assert not re.search(r"(href|src)=", svg) and "http" not in svg
    assert "orders &lt;records&gt;/s: 2.5/s now, peak 4/s" in svg  # a label is text, escaped
    assert "<polyline" in svg


def test_a_sparkline_without_samples_says_so():
    svg = sparkline([], "quiet")
    assert "no samples yet" in svg and "<polyline" not in svg


def test_rates_are_short():
    assert [format_rate(v) for v in (0, 3, 3.46, 120.4, 1234, 45678, 2_500_000)] == [
        "0", "3", "3.5", "120", "1.2k", "46k", "2.5M"]


def test_a_young_window_fills_from_the_right():
    assert points([1, 1], width=100, height=10, slots=5) == [(75, 2), (100, 2)]
