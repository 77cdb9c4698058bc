"""Our own implementation of the Llama / Mistral / Qwen2 / Qwen3 decoder families."""
