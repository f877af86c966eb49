"""The building blocks families are made of: tensor-parallel linear layers and embeddings, norms, attention and
its variants (sliding window, chunked local, latent, cross-head norms), rotary embeddings, the gated MLP,
mixture-of-experts blocks, Gated DeltaNet with its per-sequence state, and quantized weights (one module per
method)."""
