"""EC2 error codes -> gbroker provider errors that say what to do.

Kept apart from the provider so the table can be read (and unit tested) on
its own. Every code not listed becomes a plain ProviderError carrying the
code and AWS's message.
"""

from __future__ import annotations

from collections.abc import Sequence

from botocore.exceptions import (
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from broker.nodes.providers.base import (
    CapacityUnavailable,
    ProviderConfigError,
    ProviderCredentialsError,
    ProviderError,
    ProviderUnreachable,
)

CAPACITY_CODES: frozenset[str] = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
    }
)
"""The cloud cannot give us this instance now; another type, zone or market might."""

CREDENTIAL_CODES: frozenset[str] = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
        "UnrecognizedClientException",
        "OptInRequired",
    }
)
"""The request was not accepted as coming from anyone (bad or expired keys)."""

PERMISSION_CODES: frozenset[str] = frozenset({"UnauthorizedOperation", "AccessDenied"})
"""Known caller, missing IAM permission."""

CONFIG_CODES: frozenset[str] = frozenset(
    {
        "InvalidAMIID.NotFound",
        "InvalidAMIID.Malformed",
        "InvalidSubnetID.NotFound",
        "InvalidSubnetID.Malformed",
        "InvalidGroup.NotFound",
        "InvalidGroupId.Malformed",
        "InvalidKeyPair.NotFound",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidLaunchTemplateId.NotFound",
        "InvalidLaunchTemplateId.Malformed",
        "InvalidParameterValue",
        "InvalidParameterCombination",
        "InvalidInstanceType",
        "Unsupported",
    }
)
"""The provider settings name something that does not exist or cannot go together."""

IAM_ACTIONS = "ec2:RunInstances, ec2:CreateTags, ec2:DescribeInstances, ec2:TerminateInstances, " \
    "ec2:DescribeSpotInstanceRequests"


def map_aws_error(exc: Exception, *, action: str, nodes: Sequence[str] = ()) -> ProviderError:
    """Translate a boto3/botocore exception into a ProviderError with a hint."""
    where = f" for {', '.join(nodes)}" if nodes else ""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
        return ProviderCredentialsError(
            f"no usable AWS credentials to {action}{where}: {exc}",
            hint="set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) in the "
            "daemon's environment, or run it on a host with an instance role",
        )
    if isinstance(exc, NoRegionError):
        return ProviderConfigError(
            f"no AWS region to {action}{where}",
            hint="set 'region' in the aws provider settings",
        )
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return ProviderUnreachable(
            f"could not reach the EC2 endpoint to {action}{where}: {exc}",
            hint="check network access and the 'region' / 'endpoint_url' settings; "
            "instances may exist already, the next call will find them by tag",
        )
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "Unknown"))
        msg = str(err.get("Message", "")).strip()
        text = f"EC2 refused to {action}{where}: {code}" + (f": {msg}" if msg else "")
        mapped = _client_error(code, text)
        mapped.code = code
        return mapped
    return ProviderError(f"AWS client error while trying to {action}{where}: {exc}")


def _client_error(code: str, text: str) -> ProviderError:
    if code in CAPACITY_CODES:
        return CapacityUnavailable(
            text,
            hint="try another instance type or availability zone for this partition, or "
            "on-demand instead of spot; Slurm retries the node after ResumeTimeout",
        )
    if code in CREDENTIAL_CODES:
        return ProviderCredentialsError(
            text,
            hint="the AWS credentials are wrong or expired; refresh them (AWS_PROFILE, "
            "access keys or the instance role) and retry",
        )
    if code in PERMISSION_CODES:
        return ProviderCredentialsError(text, hint=f"grant the gbroker IAM identity {IAM_ACTIONS}")
    if code in CONFIG_CODES:
        return ProviderConfigError(
            text,
            hint="fix the aws provider settings (ami, launch_template, instance_types, "
            "subnet_id, security_group_ids) for this region",
        )
    return ProviderError(text, hint="see the EC2 error code above; retry if it is transient")
