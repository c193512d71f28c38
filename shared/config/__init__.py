"""The one configuration: YAML into frozen, validated dataclasses (shared/config/config.py).

One module per section (audio, data, features, model, producers, ring, stager,
text, transport), each validating its own keys; checks.py the rules between
sections; loader.py the machinery that builds dataclasses from YAML with errors
that name the key; environment.py what comes from the environment. The names
below are the package's face: ``from ringfeed.shared.config import Config``.
"""

from ringfeed.shared.config.config import (
    INPUT_PATH_KEYS,
    Config,
    config_from_dict,
    config_from_yaml,
    load_config,
    read_raw,
    replace,
)
from ringfeed.shared.config.loader import ConfigError

__all__ = [
    "INPUT_PATH_KEYS",
    "Config",
    "ConfigError",
    "config_from_dict",
    "config_from_yaml",
    "load_config",
    "read_raw",
    "replace",
]
