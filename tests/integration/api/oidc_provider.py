"""A real OIDC identity provider for tests: key pairs made here, a discovery document and a
JWKS served over HTTP on loopback, and tokens minted with PyJWT."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "torchyard-api"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if self.algorithm.startswith("ES"):
            data = jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True)
        else:
            data = jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
        return {**data, "kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def rsa_key(kid: str | None = None) -> SigningKey:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return SigningKey(kid=kid or f"rsa-{secrets.token_hex(4)}", algorithm="RS256", private=private)


def ec_key() -> SigningKey:
    private = ec.generate_private_key(ec.SECP256R1())
    return SigningKey(kid=f"ec-{secrets.token_hex(4)}", algorithm="ES256", private=private)


@dataclass
class Provider:
    """The issuer: `keys` are published in its JWKS (mutable: rotate by appending)."""

    issuer: str = ""
    keys: list[SigningKey] = field(default_factory=list)
    jwks_fetches: int = 0

    def token(
        self,
        *,
        groups: list[str] | str | None = None,
        sub: str = "alice",
        key: SigningKey | None = None,
        lifetime_s: float = 300,
        **claims: Any,
    ) -> str:
        """A token signed by `key` (default: the first published key); `claims` override."""
        key = key or self.keys[0]
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": sub,
            "iat": now,
            "exp": now + int(lifetime_s),
            "email": f"{sub}@example.com",
        }
        if groups is not None:
            body["groups"] = groups
        body.update(claims)
        return jwt.encode(body, key.private, algorithm=key.algorithm, headers={"kid": key.kid})

    def forged(self, *, algorithm: str, secret: bytes, groups: list[str]) -> str:
        """A token whose header says `algorithm` (`none`, `HS256`), signed by hand with
        `secret` for HS256 (PyJWT refuses to use a public key as an HMAC secret)."""
        now = int(time.time())
        header = {"alg": algorithm, "typ": "JWT", "kid": self.keys[0].kid}
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "mallory", "exp": now + 300}
        body["groups"] = groups  # type: ignore[assignment]
        signing_input = f"{_b64(json.dumps(header))}.{_b64(json.dumps(body))}"
        signature = b""
        if algorithm == "HS256":
            signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@contextmanager
def serve(provider: Provider) -> Iterator[Provider]:
    """Serve `provider`'s discovery document and JWKS on a free loopback port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/.well-known/openid-configuration":
                body = {"issuer": provider.issuer, "jwks_uri": f"{provider.issuer}/jwks.json"}
            elif self.path == "/jwks.json":
                provider.jwks_fetches += 1
                body = {"keys": [key.jwk() for key in provider.keys]}
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    provider.issuer = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
