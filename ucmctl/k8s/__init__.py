"""Kubernetes manifests for a Plan (`ucmctl render --k8s DIR`): rendered and schema-checked,
never applied by ucmctl. `render` builds the objects, `validate` checks them against their
schemas (the tests run it on every example topology)."""
