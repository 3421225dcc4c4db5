"""gateway-fleet: saved SQL as governed HTTP endpoints."""
# The one version source: setup.cfg reads it (attr:), so the package metadata, `fleet --version`
# and /openapi.json's info.version say the same; CHANGELOG.md says what each version has.
__version__ = "0.1.0"
