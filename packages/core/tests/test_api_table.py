"""The core README's API table is the one the code produces (regenerate: ``python -m josef.server.api_table``)."""

from pathlib import Path

from josef.server.api_table import readme_table, render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_table_matches_what_the_broker_registers(josef_broker):
    """With the workspace's plugins installed (as every nox session has them), the table is current."""
    expected = render(josef_broker.broker.dispatcher.apis)
    assert readme_table(README.read_text()) == expected, (
        "packages/core/README.md is stale: regenerate its table with `python -m josef.server.api_table`")


def test_the_table_lists_every_api_key_with_the_registered_range(josef_broker):
    table = render(josef_broker.broker.dispatcher.apis)
    rows = {int(line.split("|")[1]): line for line in table.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()}
    assert rows[18].split("|")[4].strip() == "0-4"  # ApiVersions
    produce = josef_broker.broker.dispatcher.apis[0]
    assert rows[0].split("|")[4].strip() == f"{produce.min_version}-{produce.max_version}"
    assert all(rows[key].split("|")[4].strip() == "—" for key in rows if key not in josef_broker.broker.dispatcher.apis)
