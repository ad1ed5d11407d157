"""The UCM KV connector that vLLM loads through `kv_connector_module_path`."""
