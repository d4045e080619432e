"""vspec runtime: loaded inside vLLM processes through the ``vllm.general_plugins`` entry point.

Importing this package must stay cheap and must not import vLLM or torch: the CLI imports it too.
"""

__version__ = "0.1.0"

# The vLLM line vspec is written and tested against; `vspec doctor` warns on any other version.
SUPPORTED_VLLM = ">=0.32,<0.33"
TESTED_VLLM = "0.32.0"
