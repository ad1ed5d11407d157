"""`render --k8s`'s options (namespace, images, the store's claim size and class), checked as
Kubernetes spells them, and the deployment's name as the DNS label every object's name starts with."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ucmctl import __version__
from ucmctl.core.errors import UcmctlError
from ucmctl.core.platforms import Platform
from ucmctl.plan.model import Process

DEFAULT_IMAGE = f"ucmctl:{__version__}"  # an image with the engine, ucmctl and its connector

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_NAME_ROOM = 40  # <name>-mooncake-master and the pods' <name>-prefill-<group>-<worker> stay <= 63


@dataclass(frozen=True)
class Options:
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    platform_images: dict[str, str] = field(default_factory=dict)  # platform -> image
    storage_class: str | None = None
    store_size: str = "1Ti"

    def image_for(self, platform: str, process: Process | None = None) -> str:
        """`--image PLATFORM=...`, else `--image ...`, else the image the Plan runs the process in
        (its topology's container; an OCI bundle's folder is no image), else ucmctl's default."""
        if platform in self.platform_images:
            return self.platform_images[platform]
        if self.image != DEFAULT_IMAGE or process is None or process.container is None:
            return self.image
        if process.container.runtime == "oci":
            return self.image
        return process.container.image


def parse_images(values: list[str]) -> tuple[str, dict[str, str]]:
    """`--image IMAGE` (every pod) and `--image PLATFORM=IMAGE` (that platform's pods)."""
    default = DEFAULT_IMAGE
    per_platform: dict[str, str] = {}
    for value in values:
        platform, sep, image = value.partition("=")
        if not sep:
            platform, image = "", value
        elif platform not in {p.value for p in Platform}:
            raise UcmctlError.one(
                f"--image {value}: unknown platform '{platform}'",
                fix=f"use IMAGE or PLATFORM=IMAGE with one of {', '.join(p.value for p in Platform)}",
            )
        if not image or any(ch.isspace() for ch in image):
            raise UcmctlError.one(
                f"--image {value!r}: not an image reference", fix="e.g. registry/ucmctl:0.1"
            )
        if platform:
            per_platform[platform] = image
        else:
            default = image
    return default, per_platform


def check_options(o: Options) -> None:
    if len(o.namespace) > 63 or not _DNS_LABEL.match(o.namespace):
        raise UcmctlError.one(
            f"--namespace {o.namespace!r} is not a Kubernetes namespace name",
            fix="lowercase letters, digits and '-', at most 63",
        )
    if o.storage_class is not None and (
        len(o.storage_class) > 253 or not _DNS_SUBDOMAIN.match(o.storage_class)
    ):
        raise UcmctlError.one(
            f"--storage-class {o.storage_class!r} is not a StorageClass name",
            fix="lowercase letters, digits, '-' and '.'",
        )
    if not _QUANTITY.match(o.store_size):
        raise UcmctlError.one(
            f"--store-size {o.store_size!r} is not a Kubernetes quantity", fix="e.g. 1Ti, 500Gi"
        )


def k8s_name(deployment: str) -> str:
    """The deployment's name as a DNS-1035 label prefix (Services and pod hostnames need one)."""
    name = re.sub(r"[^a-z0-9-]+", "-", deployment.lower())
    name = re.sub(r"-{2,}", "-", name).strip("-")
    if not name[:1].isalpha():
        name = f"ucm-{name}".rstrip("-")
    return name[:_NAME_ROOM].rstrip("-")
