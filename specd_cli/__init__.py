"""The entry points: the `specd` command, the launcher of `specd up` and the options -> config mapping.

The one package that imports the services; specd/ (the base they share) imports none of them.
"""
