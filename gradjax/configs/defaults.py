"""Every option at its default (:func:`gradjax.run.config.defaults`): what a command runs without
``--config``. ``--config.<path>=...`` given without ``--config`` overrides these."""

from gradjax.run import config


def get_config():
  return config.defaults()
