"""A museum publishing an IIIF Change Discovery stream: the model and its loopback server."""

from .museum import Museum
from .server import IiifServer

__all__ = ["IiifServer", "Museum"]
