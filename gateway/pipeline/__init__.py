"""The call pipeline shared by every entry point (see ``call.py`` for the stages)."""
from .adhoc import AdHocCall, AdHocStatements
from .args import RESERVED, CallArgs, lower_timeout, split_reserved
from .call import Pipeline
from .saved import SavedCall

__all__ = ["Pipeline", "SavedCall", "AdHocCall", "AdHocStatements", "CallArgs", "RESERVED", "lower_timeout",
           "split_reserved"]
