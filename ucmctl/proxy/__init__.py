"""The PD proxy: routes each request to prefill then decode instances (or one mixed instance)."""
