"""The test suite (a package, so that test modules import the shared launches from ``tests.conftest``)."""
