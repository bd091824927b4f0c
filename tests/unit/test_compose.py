"""Static checks of the deployment files: docker-compose.yml, Dockerfile, .env.example.

Docker is not needed: the compose file is parsed as YAML and its wiring is checked,
and every ``OMNIQ_*`` variable it sets is checked against the fields of
:class:`storage.settings.Settings` (by walking ``model_fields``; nothing is built from
the environment).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from storage.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERIGNORE = ROOT / ".dockerignore"

APP_SERVICES = ("migrate", "api", "worker", "webhooks")
ALL_SERVICES = {"postgres", "redis", "minio", "minio-init", *APP_SERVICES}

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}
INTERPOLATION = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
)
SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY", re.IGNORECASE)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def settings_env_fields(model: type[BaseModel] = Settings, prefix: str = "OMNIQ_") -> dict:
    """Map every environment variable name Settings reads to its field."""
    names: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        env_name = prefix + name.upper()
        names[env_name] = field
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.update(settings_env_fields(annotation, env_name + "__"))
    return names


def resolve(value: str) -> str:
    """Interpolate like compose would with an empty environment (required -> sample)."""

    def sub(match: re.Match[str]) -> str:
        op = match.group("op") or ""
        if op.endswith("-"):
            return match.group("arg")
        return "sample-value"

    return INTERPOLATION.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def build_of(service: dict[str, Any]) -> dict[str, Any]:
    build = service["build"]
    return {"context": build} if isinstance(build, str) else build


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def test_all_services_present(services: dict[str, Any]) -> None:
    assert set(services) >= ALL_SERVICES


def test_no_obsolete_version_key(compose: dict[str, Any]) -> None:
    assert "version" not in compose


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_build_from_the_dockerfile(services: dict[str, Any], name: str) -> None:
    build = build_of(services[name])
    context = ROOT / build.get("context", ".")
    assert context.resolve() == ROOT
    assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE


def test_commands(services: dict[str, Any]) -> None:
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["restart"] == "no"
    assert services["api"]["command"][0] == "api"
    assert services["worker"]["command"][0] == "worker"
    assert services["webhooks"]["command"] == ["webhooks", "serve"]
    assert "8000:8000" in services["api"]["ports"]


def test_worker_builds_the_cuda_image(services: dict[str, Any]) -> None:
    args = build_of(services["worker"])["args"]
    assert "nvidia/cuda:" in resolve(args["BASE"])
    assert resolve(args["TORCH_INDEX"]).rstrip("/").endswith("/whl/cu124")
    assert services["worker"]["image"] != services["api"]["image"]


@pytest.mark.parametrize("name", APP_SERVICES)
def test_omniqueue_env_vars_are_real_settings(
    services: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = settings_env_fields()
    env = environment(services[name])
    omniq = {k: v for k, v in env.items() if k.startswith("OMNIQ_")}
    assert omniq, f"{name} sets no OMNIQ_ variables"
    unknown = sorted(set(omniq) - set(fields))
    assert not unknown, f"{name}: not fields of storage.settings.Settings: {unknown}"
    for key in omniq:
        annotation = fields[key].annotation
        assert not (isinstance(annotation, type) and issubclass(annotation, BaseModel)), (
            f"{key} is a settings group; set its fields with __"
        )
    # The values parse the way the services will parse them: through pydantic-settings.
    for key in [k for k in os.environ if k.startswith("OMNIQ_")]:
        monkeypatch.delenv(key)
    for key, raw in omniq.items():
        monkeypatch.setenv(key, str(resolve(raw)))
    Settings()


def test_app_services_share_the_anchor(compose: dict[str, Any], services: dict) -> None:
    shared = compose["x-omniqueue-env"]
    assert shared["OMNIQ_MODE"] == "production"
    assert shared["OMNIQ_AUTH"] == "required"
    assert shared["OMNIQ_DATABASE__URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in shared["OMNIQ_DATABASE__URL"]
    assert shared["OMNIQ_REDIS__URL"].startswith("redis://redis:6379/")
    assert shared["OMNIQ_S3__ENDPOINT_URL"] == "http://minio:9000"
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert {k: env[k] for k in shared} == shared, name
    assert services["worker"]["environment"]["OMNIQ_WORKER__DEVICE"] == "cuda:0"


def test_s3_credentials_are_the_minio_root_credentials(compose: dict[str, Any]) -> None:
    shared = compose["x-omniqueue-env"]
    minio = environment(compose["services"]["minio"])
    assert INTERPOLATION.search(shared["OMNIQ_S3__ACCESS_KEY_ID"])["name"] == "MINIO_ROOT_USER"
    assert INTERPOLATION.search(shared["OMNIQ_S3__SECRET_ACCESS_KEY"])["name"] == (
        "MINIO_ROOT_PASSWORD"
    )
    assert INTERPOLATION.search(minio["MINIO_ROOT_USER"])["name"] == "MINIO_ROOT_USER"
    assert INTERPOLATION.search(minio["MINIO_ROOT_PASSWORD"])["name"] == "MINIO_ROOT_PASSWORD"


def test_bucket_is_created_by_minio_init(compose: dict[str, Any]) -> None:
    init = compose["services"]["minio-init"]
    assert depends_on(init) == {"minio": "service_healthy"}
    assert init["restart"] == "no"
    script = " ".join(init["command"]) if isinstance(init["command"], list) else init["command"]
    assert "mc mb --ignore-existing" in script
    bucket = compose["x-omniqueue-env"]["OMNIQ_S3__BUCKET"]
    assert environment(init)["BUCKET"] == bucket


def test_depends_on_conditions(services: dict[str, Any]) -> None:
    assert depends_on(services["migrate"]) == {"postgres": "service_healthy"}
    expected = {
        "migrate": "service_completed_successfully",
        "minio-init": "service_completed_successfully",
        "postgres": "service_healthy",
        "redis": "service_healthy",
        "minio": "service_healthy",
    }
    for name in ("api", "worker", "webhooks"):
        assert depends_on(services[name]) == expected, name


@pytest.mark.parametrize("name", ["postgres", "redis", "minio", "api"])
def test_healthchecks(services: dict[str, Any], name: str) -> None:
    check = services[name].get("healthcheck")
    assert check and check.get("test"), f"{name} has no healthcheck"
    assert not check.get("disable", False)
    test = check["test"]
    text = test if isinstance(test, str) else " ".join(test)
    probe = {
        "postgres": "pg_isready",
        "redis": "redis-cli ping",
        "minio": "mc ready local",
        "api": "http://localhost:8000/ready",
    }[name]
    assert probe in text


def test_api_healthcheck_needs_no_curl(services: dict[str, Any]) -> None:
    test = services["api"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]


def test_worker_reserves_an_nvidia_gpu(services: dict[str, Any]) -> None:
    worker = services["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) and d.get("count") == 1
        for d in devices
    )
    grace = worker["stop_grace_period"]
    assert re.fullmatch(r"\d+[sm]", grace)
    seconds = int(grace[:-1]) * (60 if grace.endswith("m") else 1)
    assert seconds >= 60


def test_worker_mounts_weights_read_only(services: dict[str, Any]) -> None:
    mounts = [resolve(v) for v in services["worker"]["volumes"] if isinstance(v, str)]
    assert any(m.split(":")[1] == "/weights" and m.endswith(":ro") for m in mounts)


def test_named_volumes_declared_and_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            if isinstance(volume, str):
                source = resolve(volume).split(":")[0]
            else:
                source = resolve(volume.get("source", ""))
            if source and not source.startswith((".", "/", "~")):
                used.add(source)
    assert used == declared
    assert {"postgres-data", "redis-data", "minio-data"} <= declared


def _walk_strings(node: Any, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk_strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_strings(value, f"{path}[{i}]")
    elif node is not None:
        yield path, str(node)


def test_no_literal_secrets(compose: dict[str, Any]) -> None:
    checked = 0
    for path, value in _walk_strings(compose):
        key = path.rsplit(".", 1)[-1]
        if SECRET_KEY.search(key) and "[" not in key:
            checked += 1
            assert re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:\?[^}]*)?\}", value), (
                f"{path} must come from a required ${{VAR:?...}}, not a literal"
            )
    assert checked >= 4
    db_url = compose["x-omniqueue-env"]["OMNIQ_DATABASE__URL"]
    password = db_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD(:\?[^}]*)?\}", password)
    # The required form (:?) appears for every secret variable at least once.
    text = COMPOSE_FILE.read_text()
    for var in ("POSTGRES_PASSWORD", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"):
        assert "${" + var + ":?" in text, var


def test_env_example_lists_required_variables() -> None:
    text = COMPOSE_FILE.read_text()
    required = {m["name"] for m in INTERPOLATION.finditer(text) if (m["op"] or "").endswith("?")}
    listed = {
        line.split("=", 1)[0].strip()
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }
    assert required == {"POSTGRES_PASSWORD", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}
    assert required <= listed


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's instructions per ``FROM … AS name`` stage ("" before the first)."""
    stages: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for kw, rest in _dockerfile_instructions():
        if kw == "FROM":
            current = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            stages[current] = []
        stages[current].append((kw, rest))
    return stages


def test_dockerfile() -> None:
    instructions = _dockerfile_instructions()
    args = {rest.split("=", 1)[0] for kw, rest in instructions if kw == "ARG"}
    assert {"BASE", "TORCH_INDEX"} <= args
    stages = _stages()
    assert ("FROM", "${BASE} AS python") in stages["python"]
    assert stages["worker"][0] == ("FROM", "python AS worker")
    assert stages["api"][0] == ("FROM", "python AS api")
    assert list(stages)[-1] == "api", "a plain `docker build .` gives the API image"
    worker_runs = [rest for kw, rest in stages["worker"] if kw == "RUN"]
    torch_run = next(
        i for i, r in enumerate(worker_runs) if "--index-url" in r and "TORCH_INDEX" in r
    )
    app_run = next(i for i, r in enumerate(worker_runs) if "pip install '.[worker," in r)
    assert torch_run < app_run, "torch must be installed before the project"
    # the API tier installs its own extra only, and its build fails if torch came with it
    api_runs = " ".join(rest for kw, rest in stages["api"] if kw == "RUN")
    assert "pip install '.[api]'" in api_runs and "find_spec('torch')" in api_runs
    assert "torch" not in api_runs.replace("find_spec('torch')", "")
    entrypoints = [rest for kw, rest in instructions if kw == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["omniqueue"]
    assert json.loads(next(r for kw, r in stages["worker"] if kw == "CMD")) == ["worker"]
    cmds = [rest for kw, rest in stages["api"] if kw == "CMD"]
    assert json.loads(cmds[-1]) == ["api", "--host", "0.0.0.0", "--port", "8000"]
    for name in ("worker", "api"):
        users = [rest for kw, rest in stages[name] if kw == "USER"]
        assert users and users[-1] not in {"root", "0"}, name
        copies = [rest for kw, rest in stages[name] if kw == "COPY"]
        assert copies == ["--from=source /app /app"], name
    assert ("WORKDIR", "/app") in instructions
    copied = " ".join(rest for kw, rest in stages["source"] if kw == "COPY")
    for item in (
        "pyproject.toml",
        "README.md",
        "api",
        "workers",
        "realtime",
        "storage",
        "models",
        "migrations",
        "cli",
    ):
        assert re.search(rf"(^|\s){re.escape(item)}(\s|$)", copied), item


def test_images_per_tier(services: dict[str, Any]) -> None:
    """api, migrate and the webhook sender run the torch-free API image, the worker the
    CUDA worker image."""
    for name in ("api", "migrate", "webhooks"):
        assert build_of(services[name])["target"] == "api", name
        assert services[name]["image"] == services["api"]["image"]
    assert build_of(services["worker"])["target"] == "worker"


def test_dockerfile_env_vars_are_real_settings() -> None:
    fields = settings_env_fields()
    for kw, rest in _dockerfile_instructions():
        if kw == "ENV":
            for name in re.findall(r"(?:^|\s)(OMNIQ_\w+)=", rest):
                assert name in fields, name


def test_dockerignore_keeps_context_clean() -> None:
    entries = {
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", ".env", "omniqueue-data", "weights"} <= entries
