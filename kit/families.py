"""The model families the kit knows by name, written once.

``FORMULA``: counted by arithmetic from their config (``kit.models``, no torch) and whose activations have
a formula (``kit.estimate.activations``); any other Hugging Face ``model_type`` is built on the meta device
and traced. ``SWIGLU``: the decoders among them with a SwiGLU MLP and RMSNorm (Hugging Face's Llama
block), whose activations are also followed op by op for a trainable subset (``kit.trainable``).
"""

FORMULA = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "dit")
SWIGLU = ("llama", "mistral", "qwen2")
