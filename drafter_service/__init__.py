"""The drafter: prompt-lookup (n-gram) draft tokens for every sequence of a verifier, one batched RPC per step."""
