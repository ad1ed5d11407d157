"""Where a node's or a side's processes run: on the node's own Python (`bare`), or in a container
image under podman or docker, or as a Slurm job step in an image (pyxis) or in an OCI bundle
(Slurm's own `srun --container`). The engine in the image is used as it is; ucmctl's own pieces
(the connector, the native store, the proxy) come from a derived image or bundle (`ucmctl image
build`) or are already inside the image the user names.

Everything here reaches a command line, so every value is checked to be one plain word of its
kind: an image reference, an absolute path, a size, a user.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


def _env_text(v: Any) -> Any:
    """YAML turns `10` and `false` into numbers and booleans; environment values are text."""
    if isinstance(v, dict):
        return {
            k: (str(x).lower() if isinstance(x, bool) else str(x) if isinstance(x, (int, float)) else x)
            for k, x in v.items()
        }
    return v


Env = Annotated[dict[str, str], BeforeValidator(_env_text)]


Runtime = Literal["bare", "podman", "docker", "pyxis", "oci"]

# An image reference as the OCI distribution spec writes one: [registry[:port]/]repository
# (lowercase components), then an optional :tag and an optional @digest.
IMAGE_RE = re.compile(
    r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?"  # registry (or the first path component)
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?"
)
PATH_RE = re.compile(r"/[A-Za-z0-9_.,+@%=/-]*")
SIZE_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?[bkmgBKMG]?")
USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?")
OPTION_RE = re.compile(r"--[a-z][a-z0-9-]*(?:=[A-Za-z0-9_.,:/=@+%-]*)?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `run` options ucmctl sets itself from the keys above (and the process): not given twice.
MANAGED_OPTIONS = frozenset(
    {
        "--name",
        "--label",
        "--network",
        "--net",
        "--ipc",
        "--shm-size",
        "--env",
        "--env-file",
        "--volume",
        "--mount",
        "--device",
        "--gpus",
        "--init",
        "--detach",
        "--rm",
        "--user",
        "--pull",
        "--replace",
        "--workdir",
        "--entrypoint",
    }
)


def _absolute_path(v: str, what: str) -> str:
    if not v.startswith("/"):
        raise ValueError(f"{what} {v!r} is relative: write it as an absolute path on the node")
    if not PATH_RE.fullmatch(v) or "/../" in f"{v}/" or "/./" in f"{v}/":
        raise ValueError(
            f"{what} {v!r} is not a plain absolute path: use letters, digits and _ . , + @ % = - /, "
            "without . or .. components"
        )
    return posixpath.normpath(v) if v != "/" else v


class Mount(BaseModel):
    """A bind mount: `HOST[:CONTAINER][:ro|rw]`, both sides absolute (the container side is the
    host side when not given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    container: str
    read_only: bool = False

    def option(self) -> str:
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


def _mount(v: object) -> object:
    if not isinstance(v, str):
        return v
    parts = v.split(":")
    mode = parts.pop() if len(parts) > 1 and parts[-1] in ("ro", "rw") else "rw"
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"mount {v!r}: write HOST_PATH[:CONTAINER_PATH][:ro]")
    host = _absolute_path(parts[0], "the mount's host path")
    container = _absolute_path(parts[1], "the mount's container path") if len(parts) == 2 else host
    return {"host": host, "container": container, "read_only": mode == "ro"}


MountSpec = Annotated[Mount, BeforeValidator(_mount)]


def _device_path(v: object) -> object:
    return _absolute_path(v, "device") if isinstance(v, str) else v


DevicePath = Annotated[str, BeforeValidator(_device_path)]


# What a Slurm job step in an image cannot be given: pyxis and ucmctl's OCI bundles share the node's
# network, IPC and process ids; pyxis pulls through enroot; a bundle's user is its config.json's.
_NOT_A_STEP = frozenset({"devices", "shm_size", "ipc", "network", "user", "pull", "options"})


class Container(BaseModel):
    """`container:` of a node or a side."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: Runtime = Field(
        "bare",
        description="bare (the node's Python), podman or docker (over SSH), pyxis (Slurm: srun "
        "--container-image) or oci (Slurm: srun --container, an OCI bundle)",
    )
    image: str | None = Field(
        None,
        description="the engine's image (vllm/vllm-openai:..., quay.io/ascend/vllm-ascend:...); with "
        "`ucmctl image build` ucmctl runs a derived image of it that adds its connector and store",
    )
    derived: bool = Field(
        True,
        description="run the image `ucmctl image build` derives from `image` (it adds ucmctl); false: "
        "`image` has ucmctl inside already (preflight checks that it imports)",
    )
    python: str = Field("python3", pattern=r"^[A-Za-z0-9_./-]+$", description="the image's Python")
    mounts: list[MountSpec] = Field(
        default_factory=list,
        description="extra bind mounts, HOST[:CONTAINER][:ro] (the model folder, the store's backends "
        "and the run folder are mounted without asking)",
    )
    devices: list[DevicePath] = Field(
        default_factory=list, description="extra device nodes to map (the cards' own are mapped already)"
    )
    env: Env = Field(default_factory=dict, description="environment set in the container")
    shm_size: str | None = Field(None, description="--shm-size (e.g. 16g); without it the IPC is the host's")
    ipc: Literal["host", "private", "shareable"] | None = Field(
        None, description="--ipc (default: host, or private with shm_size)"
    )
    network: str = Field(
        "host",
        pattern=r"^(host|ns:/[A-Za-z0-9_./-]+)$",
        description="host (default), or ns:/run/netns/NAME (podman only): the node's addresses either way",
    )
    user: str | None = Field(None, description="--user USER[:GROUP] inside the container")
    pull: Literal["never", "missing", "always"] = Field(
        "missing", description="when the runtime pulls `image`: never, missing, always"
    )
    options: list[str] = Field(
        default_factory=list,
        description="extra `run` options, each one word --name[=value] (e.g. --cgroup-parent=/x)",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("runtime") == "oci":  # an OCI bundle: config.json, rootfs/
            return _absolute_path(v, "the OCI bundle")
        if v is not None and info.data.get("runtime") == "pyxis":
            # enroot's forms: [REGISTRY#]IMAGE[:TAG], or a squashfs file on the node
            if v.startswith("/"):
                return _absolute_path(v, "the image file")
            registry, _, rest = v.rpartition("#")
            if (
                not registry or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?", registry)
            ) and IMAGE_RE.fullmatch(rest):
                return v
            raise ValueError(
                "is not a pyxis image: write [REGISTRY#]REPOSITORY[:TAG] or the absolute path of a "
                "squashfs file, no spaces or shell characters"
            )
        if v is not None and not IMAGE_RE.fullmatch(v):
            raise ValueError(
                "is not an image reference: write [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], "
                "the repository in lowercase, no spaces or shell characters"
            )
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str | None) -> str | None:
        if v is not None and not SIZE_RE.fullmatch(v):
            raise ValueError("is not a size: write a number with b, k, m or g (e.g. 16g)")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not USER_RE.fullmatch(v):
            raise ValueError("is not USER or USER:GROUP (names or numbers)")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for option in v:
            if not OPTION_RE.fullmatch(option):
                raise ValueError(
                    f"{option!r} is not one word --name or --name=value (no spaces or shell characters)"
                )
            if option.split("=", 1)[0] in MANAGED_OPTIONS:
                raise ValueError(
                    f"{option.split('=', 1)[0]} is set by ucmctl from container's own keys "
                    "(image, mounts, devices, env, shm_size, ipc, network, user, pull): use those"
                )
        return v

    @model_validator(mode="after")
    def _runtime_needs(self) -> Container:
        if self.runtime == "bare":
            set_keys = [k for k in self.model_fields_set if k != "runtime"]
            if set_keys:
                raise ValueError(
                    f"runtime bare runs on the node's Python and takes no {', '.join(sorted(set_keys))}: "
                    "set runtime to podman or docker, or remove them"
                )
            return self
        if self.image is None:
            raise ValueError(f"runtime {self.runtime} needs an image: set container.image")
        if self.runtime in ("pyxis", "oci"):
            refused = sorted(k for k in self.model_fields_set if k in _NOT_A_STEP)
            if refused:
                raise ValueError(
                    f"{self.runtime} runs a job step in the image with the node's network and IPC and takes "
                    f"no {', '.join(refused)}: remove them"
                )
        if self.runtime == "pyxis" and self.derived:
            raise ValueError(
                "pyxis runs images from a registry or a squashfs file, and `ucmctl image build` makes "
                "none: push an image with ucmctl inside and set derived false"
            )
        if self.runtime == "docker" and self.network != "host":
            raise ValueError(
                f"docker cannot put a container into a given network namespace (network {self.network}): "
                "use runtime podman, or network host"
            )
        if self.shm_size is not None and self.ipc == "host":
            raise ValueError("ipc host shares the node's /dev/shm, so shm_size has no effect: set one")
        return self

    @property
    def contained(self) -> bool:
        return self.runtime != "bare"

    @property
    def detached(self) -> bool:
        """Started by a container runtime on the node (podman, docker), not as a Slurm step."""
        return self.runtime in ("podman", "docker")
