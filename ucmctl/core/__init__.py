"""What every layer of ucmctl shares: errors and exit codes, platforms, the name rules, words,
tables and the UCM config's one schema. It imports nothing else of ucmctl, and nothing heavy:
the node-side programs (proxy, simulator, connector, store) import it too."""
