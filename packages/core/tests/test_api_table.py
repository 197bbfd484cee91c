"""The core README's API table is the one the code produces (regenerate: ``python -m josef.server.api_table``)."""

from pathlib import Path

from josef.server.api_table import readme_table, render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_table_matches_what_the_broker_registers(josef_broker):
    """With the workspace's plugins installed (as every nox session has them), the table is current."""
    expected = render(josef_broker.broker.dispatcher.apis, josef_broker.broker.controller_dispatcher.apis)
    assert readme_table(README.read_text()) == expected, (
        "packages/core/README.md is stale: regenerate its table with `python -m josef.server.api_table`")


def test_the_table_lists_every_api_key_with_the_registered_range(josef_broker):
    broker, controller = josef_broker.broker.dispatcher.apis, josef_broker.broker.controller_dispatcher.apis
    table = render(broker, controller)
    rows = {int(line.split("|")[1]): [cell.strip() for cell in line.split("|")] for line in table.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert rows[18][4] == rows[18][5] == "0-4"  # ApiVersions, on both kinds of listener
    produce = broker[0]
    assert rows[0][4:6] == [f"{produce.min_version}-{produce.max_version}", "—"]
    assert rows[52][4:6] == ["—", "2"]  # Vote: the quorum's, on controller listeners only
    assert all(rows[key][4] == "—" for key in rows if key not in broker)
    assert all(rows[key][5] == "—" for key in rows if key not in controller)
