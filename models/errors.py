"""The base of every error whose message is meant for the user (bad input, bad settings,
bad checkpoint). The command line prints these without a traceback; anything else is a bug."""


class UserError(ValueError):
    pass
