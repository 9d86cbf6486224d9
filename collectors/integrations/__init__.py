"""Telemetry from other training stacks: a Hugging Face ``TrainerCallback`` (``huggingface``), a PyTorch
Lightning ``Callback`` (``lightning``) and a torchtitan metrics logger (``torchtitan``).

Each framework is imported only by its own module; importing this package loads none of them."""
