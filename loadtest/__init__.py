"""Load tests with SSE timing (vllm bench serve definitions) and the TP-vs-PP comparison."""
