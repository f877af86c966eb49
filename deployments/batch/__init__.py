"""The OpenAI Files and Batches APIs: files in object storage, batches run by a detached actor."""
