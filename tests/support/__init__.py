"""Helpers that make test hosts (network namespaces, sshd, Slurm) and launch and check servers,
shared by the tests and benchmarks/ (which put the checkout on their path). Not in the product
package: the wheel that `ucmctl install` pushes to the serving nodes carries none of it."""
