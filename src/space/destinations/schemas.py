"""Payloads of destinations: the create body (with the secret, which is never answered), the destination as shown,
a delivery request, and the export's `delivery` (SPEC §22)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

import msgspec

from space.destinations.models import DeliveryState
from space.schemas import Input, Output

NoControl = r"^[^\x00-\x1f\x7f]*$"
Bucket = Annotated[str, msgspec.Meta(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")]
Prefix = Annotated[str, msgspec.Meta(max_length=512, pattern=r"^[^\x00-\x1f\x7f\\]*$")]
Region = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9\-]+$")]
EndpointUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern=r"^[^\x00-\x20\x7f]+$")]
AccessKeyId = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\x00-\x20\x7f]+$")]
SecretAccessKey = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]


class DestinationCreate(Input):
    """`{type: "s3", bucket, prefix?, region?, endpointUrl?, accessKeyId, secretAccessKey}`."""

    type: Literal["s3"]
    bucket: Bucket
    access_key_id: AccessKeyId
    secret_access_key: SecretAccessKey
    prefix: Prefix = ""
    region: Region | None = None
    endpoint_url: EndpointUrl | None = None

    def __repr__(self) -> str:  # never the secret, should the body reach a log line or a traceback
        return f"DestinationCreate(bucket={self.bucket!r}, prefix={self.prefix!r})"


class DestinationOut(Output):
    """A destination as answered: never its secret (nor its access key id: it names the customer's account)."""

    id: uuid.UUID
    type: Literal["s3"]
    bucket: str
    prefix: str
    region: str | None
    endpoint_url: str | None
    created_at: dt.datetime
    last_delivery_at: dt.datetime | None
    last_error: str | None


class DeliveryCreate(Input):
    """`{destinationId}`: deliver this completed export there."""

    destination_id: uuid.UUID


class Delivery(Output):
    """The export's `delivery` (SPEC §22): where, how far, when it landed, and why it failed."""

    destination_id: uuid.UUID | None
    state: DeliveryState
    delivered_at: dt.datetime | None
    error_code: str | None
