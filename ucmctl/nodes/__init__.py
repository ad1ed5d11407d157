"""The transport to a node and the process runtime on it: executors (this machine, SSH), host
keys, the lifecycle of a process group, fan-out over nodes. Launchers build on it."""
