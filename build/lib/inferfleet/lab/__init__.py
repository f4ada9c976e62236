"""The local lab: node image, S3 server and tiny model used by `inferfleet lab` and the tests."""
