//! Truthful, leak-free /healthz and /readyz for a node agent.
