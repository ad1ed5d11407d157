"""The top-level commands of `ucmctl`, which `ucmctl.cli` puts together: `planning` reads a
topology and runs nothing (validate, plan, render, schema), `deploying` changes what runs on the
nodes (up, down, install, image build), `running` asks a running deployment (status, logs,
restart, scale); `shared` holds their consoles, arguments and look-ups."""
