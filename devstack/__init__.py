"""The local platform: demo model on vLLM-CPU workers behind the gateway (`make up`, e2e tests)."""
