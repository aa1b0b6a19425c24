"""roost's error tree. Each error knows its EC2 wire code and HTTP status, and its
*kind*: ``transient`` (the same call may succeed later: retry, or answer 503 and let the
caller retry) or ``permanent`` (retrying the same call cannot help: answer it). Callers
decide retry against answer by `is_transient`, never by an error's class name or
message. The gateway, the node agents' replies (their codes come back through
`from_code`) and the controller's orchestrator adapters (`OrchestratorError` is a
`RoostError`) share this one tree.

RoostError (permanent unless a class says otherwise)
 ├── ClientError (4xx: the caller can fix the request)
 │    ├── InvalidParameterValue      400  bad value, unknown instance type
 │    ├── InvalidParameterCombination 400
 │    ├── MissingParameter           400
 │    ├── InvalidAction              400  unknown Action
 │    ├── InvalidInstanceIDMalformed 400  InvalidInstanceID.Malformed
 │    ├── InvalidInstanceIDNotFound  400  InvalidInstanceID.NotFound
 │    ├── InvalidAMIIDNotFound       400  InvalidAMIID.NotFound
 │    ├── InvalidAMIIDMalformed      400  InvalidAMIID.Malformed
 │    ├── InvalidAMIIDUnavailable    400  InvalidAMIID.Unavailable: no node can boot it
 │    ├── InvalidAMINameDuplicate    400  InvalidAMIName.Duplicate
 │    ├── InvalidAMINameMalformed    400  InvalidAMIName.Malformed
 │    ├── Unsupported                400  no node's driver can run the launch
 │    ├── InvalidID                  400  a resource id of no kind roost knows
 │    ├── IncorrectInstanceState     400
 │    ├── OperationNotPermitted      400  termination or stop protection
 │    ├── InvalidInstanceAttributeValue 400
 │    ├── IdempotentParameterMismatch 400
 │    ├── InvalidPaginationToken     400
 │    ├── MissingAction              400  MissingAction
 │    ├── TagLimitExceeded           400  TagLimitExceeded
 │    ├── InvalidInstanceType        400  InvalidInstanceType
 │    ├── InvalidVpcIDNotFound       400  InvalidVpcID.NotFound
 │    ├── InvalidVpcIDMalformed      400  InvalidVpcID.Malformed
 │    ├── InvalidVpcRange            400  InvalidVpc.Range
 │    ├── InvalidSubnetIDNotFound    400  InvalidSubnetID.NotFound
 │    ├── InvalidSubnetIDMalformed   400  InvalidSubnetID.Malformed
 │    ├── InvalidSubnetRange         400  InvalidSubnet.Range
 │    ├── InvalidSubnetConflict      400  InvalidSubnet.Conflict
 │    ├── InvalidGroupNotFound       400  InvalidGroup.NotFound
 │    ├── InvalidGroupIdMalformed    400  InvalidGroupId.Malformed
 │    ├── InvalidGroupDuplicate      400  InvalidGroup.Duplicate
 │    ├── InvalidGroupReserved       400  InvalidGroup.Reserved
 │    ├── InvalidPermissionDuplicate 400  InvalidPermission.Duplicate
 │    ├── InvalidPermissionNotFound  400  InvalidPermission.NotFound
 │    ├── InvalidPermissionMalformed 400  InvalidPermission.Malformed
 │    ├── DependencyViolation        400  DependencyViolation
 │    ├── InvalidKeyPairNotFound     400  InvalidKeyPair.NotFound
 │    ├── InvalidKeyPairDuplicate    400  InvalidKeyPair.Duplicate
 │    ├── InvalidKeyFormat           400  InvalidKey.Format
 │    ├── InvalidIPAddressInUse      400  InvalidIPAddress.InUse
 │    ├── InsufficientFreeAddressesInSubnet 400
 │    ├── InvalidBlockDeviceMapping  400  InvalidBlockDeviceMapping
 │    ├── CannotDelete               400  CannotDelete
 │    ├── InvalidVolumeNotFound      400  InvalidVolume.NotFound
 │    ├── InvalidVolumeIDMalformed   400  InvalidVolumeID.Malformed
 │    ├── InvalidVolumeZoneMismatch  400  InvalidVolume.ZoneMismatch
 │    ├── VolumeInUse                400  VolumeInUse
 │    ├── IncorrectState             400  IncorrectState (a volume's state)
 │    ├── InvalidAttachmentNotFound  400  InvalidAttachment.NotFound
 │    ├── InvalidZoneNotFound        400  InvalidZone.NotFound
 │    ├── InvalidRequest             400  InvalidRequest
 │    ├── TemplateNameExists         400  InvalidLaunchTemplateName.AlreadyExistsException
 │    ├── TemplateNameMalformed      400  InvalidLaunchTemplateName.MalformedException
 │    ├── TemplateNameNotFound       400  InvalidLaunchTemplateName.NotFoundException
 │    ├── TemplateIdMalformed        400  InvalidLaunchTemplateId.Malformed
 │    ├── TemplateIdNotFound         400  InvalidLaunchTemplateId.NotFound
 │    ├── TemplateVersionNotFound    400  InvalidLaunchTemplateId.VersionNotFound
 │    ├── InvalidNetworkInterfaceIDNotFound 400  InvalidNetworkInterfaceID.NotFound
 │    ├── InvalidRouteTableIDNotFound 400  InvalidRouteTableID.NotFound
 │    ├── InvalidNetworkAclIDNotFound 400  InvalidNetworkAclID.NotFound
 │    ├── InvalidParameter           400  InvalidParameter
 │    ├── VcpuLimitExceeded          400  an account's vCPU (or GPU) quota
 │    ├── InstanceLimitExceeded      400  an account's instance-count quota
 │    ├── AuthFailure                401
 │    ├── RequestExpired             400
 │    └── DryRunOperation            412  (EC2 reports a successful dry run as an error)
 └── ServerError (5xx)
      ├── InsufficientInstanceCapacity 500  no node can fit it (as EC2 answers it)
      ├── ServiceUnavailable          503  transient: NATS or a node unreachable, not a
      │                                     capacity answer
      ├── RequestLimitExceeded        503  transient: too many requests now
      └── InternalError               500  anything unexpected, logged with the request id

The controller's `OrchestratorError` tree (roost.controller.orchestrator) hangs below
RoostError too: `OrchestratorUnavailable` is transient, a refusal permanent.

One renderer (the gateway's serializer) turns any of them into EC2's error XML; codes
map back to classes in one place, `from_code`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

Kind = Literal["transient", "permanent"]


class RoostError(Exception):
    code = "InternalError"
    http_status = 500
    kind: ClassVar[Kind] = "permanent"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def transient(self) -> bool:
        return self.kind == "transient"


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may succeed: a `RoostError` says so by its kind; anything
    else (a bug, an unexpected library error) is permanent, so it is answered (500)
    rather than retried in a loop."""
    return isinstance(exc, RoostError) and exc.transient


class ClientError(RoostError):
    http_status = 400


class ServerError(RoostError):
    http_status = 500


class InvalidParameterValue(ClientError):
    code = "InvalidParameterValue"


class InvalidParameterCombination(ClientError):
    code = "InvalidParameterCombination"


class MissingParameter(ClientError):
    code = "MissingParameter"


class InvalidAction(ClientError):
    code = "InvalidAction"


class InvalidInstanceIDMalformed(ClientError):
    code = "InvalidInstanceID.Malformed"


class InvalidInstanceIDNotFound(ClientError):
    code = "InvalidInstanceID.NotFound"


class InvalidAMIIDNotFound(ClientError):
    code = "InvalidAMIID.NotFound"


class InvalidAMIIDMalformed(ClientError):
    code = "InvalidAMIID.Malformed"


class InvalidAMIIDUnavailable(ClientError):
    code = "InvalidAMIID.Unavailable"


class InvalidAMINameDuplicate(ClientError):
    code = "InvalidAMIName.Duplicate"


class InvalidAMINameMalformed(ClientError):
    code = "InvalidAMIName.Malformed"


class Unsupported(ClientError):
    code = "Unsupported"


class InvalidID(ClientError):
    code = "InvalidID"


class IncorrectInstanceState(ClientError):
    code = "IncorrectInstanceState"


class OperationNotPermitted(ClientError):
    code = "OperationNotPermitted"


class InvalidInstanceAttributeValue(ClientError):
    code = "InvalidInstanceAttributeValue"


class IdempotentParameterMismatch(ClientError):
    code = "IdempotentParameterMismatch"


class InvalidPaginationToken(ClientError):
    code = "InvalidPaginationToken"


class AuthFailure(ClientError):
    code = "AuthFailure"
    http_status = 401


class RequestExpired(ClientError):
    code = "RequestExpired"


class MissingAction(ClientError):
    code = "MissingAction"


class TagLimitExceeded(ClientError):
    code = "TagLimitExceeded"


class InvalidInstanceType(ClientError):
    code = "InvalidInstanceType"


class InvalidVpcIDNotFound(ClientError):
    code = "InvalidVpcID.NotFound"


class InvalidVpcIDMalformed(ClientError):
    code = "InvalidVpcID.Malformed"


class InvalidVpcRange(ClientError):
    code = "InvalidVpc.Range"


class InvalidSubnetIDNotFound(ClientError):
    code = "InvalidSubnetID.NotFound"


class InvalidSubnetIDMalformed(ClientError):
    code = "InvalidSubnetID.Malformed"


class InvalidSubnetRange(ClientError):
    code = "InvalidSubnet.Range"


class InvalidSubnetConflict(ClientError):
    code = "InvalidSubnet.Conflict"


class InvalidGroupNotFound(ClientError):
    code = "InvalidGroup.NotFound"


class InvalidGroupIdMalformed(ClientError):
    code = "InvalidGroupId.Malformed"


class InvalidGroupDuplicate(ClientError):
    code = "InvalidGroup.Duplicate"


class InvalidGroupReserved(ClientError):
    code = "InvalidGroup.Reserved"


class InvalidPermissionDuplicate(ClientError):
    code = "InvalidPermission.Duplicate"


class InvalidPermissionNotFound(ClientError):
    code = "InvalidPermission.NotFound"


class InvalidPermissionMalformed(ClientError):
    code = "InvalidPermission.Malformed"


class DependencyViolation(ClientError):
    code = "DependencyViolation"


class VPCIdNotSpecified(ClientError):
    code = "VPCIdNotSpecified"


class MissingInput(ClientError):
    code = "MissingInput"


class InvalidInput(ClientError):
    code = "InvalidInput"


class DefaultVpcAlreadyExists(ClientError):
    code = "DefaultVpcAlreadyExists"


class DefaultVpcDoesNotExist(ClientError):
    code = "DefaultVpcDoesNotExist"


class DefaultSubnetAlreadyExistsInAvailabilityZone(ClientError):
    code = "DefaultSubnetAlreadyExistsInAvailabilityZone"


class InvalidKeyPairNotFound(ClientError):
    code = "InvalidKeyPair.NotFound"


class InvalidKeyPairDuplicate(ClientError):
    code = "InvalidKeyPair.Duplicate"


class InvalidKeyFormat(ClientError):
    code = "InvalidKey.Format"


class InvalidIPAddressInUse(ClientError):
    code = "InvalidIPAddress.InUse"


class InsufficientFreeAddressesInSubnet(ClientError):
    code = "InsufficientFreeAddressesInSubnet"


class InvalidBlockDeviceMapping(ClientError):
    code = "InvalidBlockDeviceMapping"


class CannotDelete(ClientError):
    code = "CannotDelete"


class InvalidVolumeNotFound(ClientError):
    code = "InvalidVolume.NotFound"


class InvalidVolumeIDMalformed(ClientError):
    code = "InvalidVolumeID.Malformed"


class InvalidVolumeZoneMismatch(ClientError):
    code = "InvalidVolume.ZoneMismatch"


class VolumeInUse(ClientError):
    code = "VolumeInUse"


class IncorrectState(ClientError):
    code = "IncorrectState"


class InvalidAttachmentNotFound(ClientError):
    code = "InvalidAttachment.NotFound"


class InvalidZoneNotFound(ClientError):
    code = "InvalidZone.NotFound"


class InvalidRequest(ClientError):
    code = "InvalidRequest"


class TemplateNameExists(ClientError):
    code = "InvalidLaunchTemplateName.AlreadyExistsException"


class TemplateNameMalformed(ClientError):
    code = "InvalidLaunchTemplateName.MalformedException"


class TemplateNameNotFound(ClientError):
    code = "InvalidLaunchTemplateName.NotFoundException"


class TemplateIdMalformed(ClientError):
    code = "InvalidLaunchTemplateId.Malformed"


class TemplateIdNotFound(ClientError):
    code = "InvalidLaunchTemplateId.NotFound"


class TemplateVersionNotFound(ClientError):
    code = "InvalidLaunchTemplateId.VersionNotFound"


class InvalidNetworkInterfaceIDNotFound(ClientError):
    code = "InvalidNetworkInterfaceID.NotFound"


class InvalidRouteTableIDNotFound(ClientError):
    code = "InvalidRouteTableID.NotFound"


class InvalidNetworkAclIDNotFound(ClientError):
    code = "InvalidNetworkAclID.NotFound"


class InvalidParameter(ClientError):
    code = "InvalidParameter"


class VcpuLimitExceeded(ClientError):
    code = "VcpuLimitExceeded"


class InstanceLimitExceeded(ClientError):
    code = "InstanceLimitExceeded"


class DryRunOperation(ClientError):
    code = "DryRunOperation"
    http_status = 412


class InsufficientInstanceCapacity(ServerError):
    code = "InsufficientInstanceCapacity"


class ServiceUnavailable(ServerError):
    code = "ServiceUnavailable"
    http_status = 503
    kind = "transient"


class RequestLimitExceeded(ServerError):
    code = "RequestLimitExceeded"
    http_status = 503
    kind = "transient"


class InternalError(ServerError):
    code = "InternalError"


def _by_code() -> dict[str, type[RoostError]]:
    found: dict[str, type[RoostError]] = {}
    todo: list[type[RoostError]] = [RoostError]
    while todo:
        cls = todo.pop()
        if cls is not RoostError and cls.__module__ == __name__ and "code" in vars(cls):
            found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


_BY_CODE = _by_code()
_BY_CODE["Throttling"] = RequestLimitExceeded  # the AWS-wide spelling of the same


def from_code(code: str, message: str = "") -> RoostError:
    """The error an EC2 wire code names (from a node's reply, or an EC2 API's answer);
    an unknown code is internal (permanent)."""
    cls = _BY_CODE.get(code, InternalError)
    return cls(message or code)
