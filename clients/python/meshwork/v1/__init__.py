"""Generated from proto/meshwork/v1 by clients/python/generate.sh; do not edit."""
