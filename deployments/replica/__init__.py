"""What runs on a model's replica, beside its engine: the model server, each API's handler, chat prompt rendering,
choice parsing, its LoRA adapters, its gauges; and the model's image encoder when it runs as a deployment of its
own (encoder_server.py)."""
