"""The ``cardbus`` command line: thin click commands over the library."""
