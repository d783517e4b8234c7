"""PulseIO decode engine: paged KV, sparse offload and scheduling on top of pulseio."""
