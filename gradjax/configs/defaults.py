"""Every option at its default (:func:`gradjax.config.defaults`): what a command runs without
``--config``. ``--config.<path>=...`` given without ``--config`` overrides these."""

from gradjax import config


def get_config():
  return config.defaults()
