"""A dynamic controller quorum (KIP-853) of real processes: one controller formatted ``--standalone``,
two more added with ``josef metadata-quorum add-controller``, then the first leader killed.
"""

from __future__ import annotations

import subprocess
import sys
import time

from test_kraft_cluster import FAST, active_controller, create, describe_quorum, eventually, topics_on


def josef(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"josef {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def test_standalone_controller_grows_to_three_voters_and_survives_losing_the_first_leader(josef_cluster):
    cluster = josef_cluster(controllers=3, brokers=1, start=False, **FAST, **{"controller.quorum.voters": None})
    first, second, third = cluster.controllers
    [broker] = cluster.brokers
    for node in cluster.nodes:
        node.properties["controller.quorum.bootstrap.servers"] = first.controller_address
    cluster.write_properties()
    cluster_id = josef("storage", "random-uuid").stdout.strip()
    cluster.cluster_id = cluster_id

    # Refusals: broker-only nodes and static voters cannot be formatted for a dynamic quorum.
    refused = josef("storage", "format", "-t", cluster_id, "-c", str(broker.properties_path), "--standalone",
                    check=False)
    assert refused.returncode != 0 and "only for controllers" in refused.stderr
    refused = josef("storage", "format", "-t", cluster_id, "-c", str(second.properties_path), check=False)
    assert refused.returncode != 0 and "--no-initial-controllers" in refused.stderr

    josef("storage", "format", "-t", cluster_id, "-c", str(first.properties_path), "--standalone")
    assert (first.log_dirs[0] / "__cluster_metadata-0" / "00000000000000000000-0000000000.checkpoint").exists()
    for node in (second, third):
        josef("storage", "format", "-t", cluster_id, "-c", str(node.properties_path), "--no-initial-controllers")
    josef("storage", "format", "-t", cluster_id, "-c", str(broker.properties_path))

    first.start(wait=False)
    broker.start(wait=False)
    first.wait_ready()
    broker.wait_ready()
    assert active_controller([first]) == first.node_id
    assert [v.replica_id for v in describe_quorum(first).current_voters] == [first.node_id]
    create(broker, "before", partitions=1)

    for node in (second, third):
        node.start()
        eventually(lambda: node.node_id in {o.replica_id for o in describe_quorum(first).observers},
                   what=f"controller {node.node_id} fetching as an observer")
        for _ in range(40):
            added = josef("metadata-quorum", "--bootstrap-controller", first.controller_address, "add-controller",
                          "--command-config", str(node.properties_path), check=False)
            if added.returncode == 0:
                break
            time.sleep(0.25)  # not caught up yet, or the previous change not committed yet
        assert added.returncode == 0, added.stdout + added.stderr
        assert f"Added controller {node.node_id}" in added.stdout
    voters = [v.replica_id for v in describe_quorum(first).current_voters]
    assert voters == [1, 2, 3]

    # Duplicates are refused with Kafka's error.
    again = josef("metadata-quorum", "--bootstrap-controller", first.controller_address, "add-controller",
                  "--command-config", str(second.properties_path), check=False)
    assert again.returncode != 0 and "DUPLICATE_VOTER" in (again.stdout + again.stderr).upper()

    killed_at = time.monotonic()
    first.kill()
    new_leader = active_controller([second, third])
    print(f"new active controller {new_leader} elected {(time.monotonic() - killed_at) * 1000:.0f} ms "
          f"after SIGKILL of {first.node_id}")
    assert new_leader in (second.node_id, third.node_id)
    assert [v.replica_id for v in describe_quorum(cluster.node(new_leader)).current_voters] == [1, 2, 3]

    create(broker, "after", partitions=1)
    eventually(lambda: {"before", "after"} <= topics_on(broker), what="the topic created after the failover")

    # The dead controller leaves the voter set; the two survivors are a majority of the new one.
    directory_id = dict(line.split("=", 1) for line in
                        (first.log_dirs[0] / "meta.properties").read_text().splitlines()
                        if "=" in line)["directory.id"]
    removed = josef("metadata-quorum", "--bootstrap-controller", second.controller_address, "remove-controller",
                    "--controller-id", str(first.node_id), "--controller-directory-id", directory_id)
    assert f"Removed controller {first.node_id}" in removed.stdout
    eventually(lambda: [v.replica_id for v in describe_quorum(cluster.node(new_leader)).current_voters] == [2, 3],
               what="the voter set without controller 1")
    status = josef("metadata-quorum", "--bootstrap-controller", second.controller_address, "describe", "--status")
    print(status.stdout)
    assert "CurrentVoters:" in status.stdout and '"id": 1,' not in status.stdout.split("CurrentObservers")[0]
