"""gnomon: a distributed job scheduler event-sourced on Kafka."""
__version__ = "0.1.0"
