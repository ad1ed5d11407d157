"""The UCM KV connector that vLLM loads through `kv_connector_module_path`.

`ucm_connector.connector.UCMConnector` is the class vLLM instantiates; importing this package
itself pulls in neither vLLM nor torch.
"""

# A child of vLLM's logger, so that vLLM's own handler and format print the connector's lines.
LOGGER_NAME = "vllm.ucm_connector"
