"""pulseio under other systems' offloading code. Each integration imports its system (transformers, ...)
when it is imported itself: `import pulseio` never does.

    pulseio.integrations.transformers   KV caches for Hugging Face transformers' `generate()`
"""
