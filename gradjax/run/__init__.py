"""The run around the attack core: one configuration (``config``), the program that turns it into an
attack on an update and its verdict (``pipeline``; a text experiment's, ``text_run``), saved solver
states (``resume``), the files a run writes (``report``), the store of a campaign's experiments
(``campaign``) and the processes a run spans (``processes``).

Imports the attack core (``gradjax.*``, ``gradjax.models``) and nothing above it: not
``gradjax.integrations``, ``gradjax.cli``, ``gradjax.configs`` or absl (``tests/test_layers.py``).
"""

import gradjax

__getattr__ = gradjax.lazy_submodules(__name__)
