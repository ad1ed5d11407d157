"""Kubernetes manifests for a Plan (`ucmctl render --k8s DIR`): rendered, never applied by ucmctl.
`render` builds the objects (`layout` maps a side to a LeaderWorkerSet, `options` checks the
flags), `manifests` writes them, one file each; the tests check them against their schemas on
every example topology (tests/support/k8s_validate.py)."""
