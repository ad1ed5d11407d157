"""Schema checks of the manifests `ucmctl render --k8s` writes, as the API server would make them
(nothing is applied): the tests run them on every example topology.

Core kinds (Deployment, Service, ConfigMap, PersistentVolumeClaim) are checked by the
`kubernetes-validate` package against Kubernetes' own OpenAPI schemas, strictly (unknown
fields are errors, as `kubectl apply --validate=strict` makes them). The LeaderWorkerSet is a
custom resource: it is checked with `jsonschema` against its CRD's openAPIV3Schema, kept in
`k8s_schemas/leaderworkerset-v1.yaml` (source and commit in its header), made strict the same way:
an object schema that lists its properties and does not preserve unknown fields refuses others.

Both packages are development dependencies (the `dev` extra); they are imported when used.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError

SCHEMA_DIR = Path(__file__).resolve().parent / "k8s_schemas"
LWS_SCHEMA = SCHEMA_DIR / "leaderworkerset-v1.yaml"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# The Kubernetes versions the core kinds are checked against: the oldest the manifests are
# meant for, and the newest the pinned kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")


class ManifestError(UcmctlError, ValueError):
    """A rendered object that its schema refuses: kind/name, the path inside it, and why."""

    status = ExitStatus.FAILURE

    def __init__(self, message: str) -> None:
        super().__init__([Problem(message)])


def _strict(node: Any) -> Any:
    """The structural schema as JSON Schema that refuses unknown fields, as the API server
    does under strict field validation; `nullable` admits null."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@cache
def lws_schema() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with LWS_SCHEMA.open(encoding="utf-8") as f:
        schema: dict[str, Any] = yaml.load(f, Loader=loader)
    return schema


@cache
def _lws_validator() -> Any:
    import jsonschema

    schema = _strict(lws_schema())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def _where(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def validate_object(obj: dict[str, Any]) -> None:
    """Raise ManifestError when the object's schema refuses it."""
    if obj.get("apiVersion") == LWS_API_VERSION and obj.get("kind") == "LeaderWorkerSet":
        errors = sorted(_lws_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            path = ".".join(str(p) for p in first.absolute_path)
            raise ManifestError(f"{_where(obj)}: {path}: {first.message}")
        return
    import kubernetes_validate

    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise ManifestError(f"{_where(obj)} (Kubernetes {version}): {path}: {exc.message}") from None
