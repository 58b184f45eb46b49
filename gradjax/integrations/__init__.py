"""gradjax inside other systems: the audit of updates captured from a federation (``audit``) and Flower's
ServerApp strategy and ClientApp gate (``flower``).

Imports the attack core and ``gradjax.run``; not ``gradjax.cli``, ``gradjax.configs`` or absl
(``tests/test_layers.py``). The PyTorch file formats (``gradjax.interop``) and the capture checks
(``gradjax.fidelity``) sit in the core, below the run, which reads them.
"""

import gradjax

__getattr__ = gradjax.lazy_submodules(__name__)
