"""``tools.url_safety``: is a URL safe to fetch (not a private, loopback or metadata address)?

Fails closed: an unsupported scheme, a missing host, a DNS error or any
address in a private, loopback, link-local, CGNAT, multicast or reserved range
is unsafe. ``HERMES_ALLOW_PRIVATE_URLS=true`` allows private addresses (never
the cloud metadata endpoints).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import Any
from urllib.parse import urlparse

__all__ = ["is_safe_url", "is_always_blocked_url", "normalize_url_for_request"]

logger = logging.getLogger(__name__)

_BLOCKED_HOSTNAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data"})
_ALWAYS_BLOCKED = (ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128"),
                   ipaddress.ip_network("100.100.100.200/32"))
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def _allow_private() -> bool:
    return os.getenv("HERMES_ALLOW_PRIVATE_URLS", "").strip().lower() in {"1", "true", "yes", "on"}


def _always_blocked(ip: Any) -> bool:
    return any(ip in net for net in _ALWAYS_BLOCKED if ip.version == net.version)


def _private(ip: Any) -> bool:
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or (ip.version == 4 and ip in _CGNAT))


def normalize_url_for_request(url: str) -> str:
    return url.strip()


def _addresses(hostname: str) -> list[Any]:
    try:
        return [ipaddress.ip_address(hostname)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(hostname, None)
    return [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]


def is_always_blocked_url(url: str) -> bool:
    try:
        hostname = (urlparse(url).hostname or "").strip().lower().rstrip(".")
        if hostname in _BLOCKED_HOSTNAMES:
            return True
        return any(_always_blocked(ip) for ip in _addresses(hostname))
    except Exception:
        return True


def is_safe_url(url: str) -> bool:
    """True when ``url`` is http(s) and every address its host resolves to is public."""
    try:
        parsed = urlparse(url)
        hostname = (parsed.hostname or "").strip().lower().rstrip(".")
        if (parsed.scheme or "").lower() not in {"http", "https"} or not hostname:
            return False
        if hostname in _BLOCKED_HOSTNAMES:
            return False
        addresses = _addresses(hostname)
        if not addresses:
            return False
        for ip in addresses:
            if _always_blocked(ip):
                return False
            if _private(ip) and not _allow_private():
                logger.warning("Blocked request to private address %s (%s)", hostname, ip)
                return False
        return True
    except Exception:  # DNS failure, a malformed URL: fail closed
        return False
