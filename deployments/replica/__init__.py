"""What runs on a model's replica, beside its engine: the model server, its LoRA adapters, its gauges."""
