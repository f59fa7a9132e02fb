"""``tile_kernels.config``: the SM count the persistent kernels use (``set_num_sms`` / ``get_num_sms`` /
``get_device_num_sms``, 36d9e45); the device is the imitated GPU (132 SMs on SM90, 148 on SM100). The later
release's ``is_ascend`` / ``get_pdl`` / ``set_pdl`` join on cd8f86c (``_later``)."""

from __future__ import annotations

from tile_kernels._standin import DEVICE_SMS, STATE


def get_device_num_sms() -> int:
    return DEVICE_SMS[STATE["arch"]]


def set_num_sms(num_sms: int) -> None:
    assert 0 < num_sms <= get_device_num_sms()
    STATE["num_sms"] = num_sms


def get_num_sms() -> int:
    return STATE["num_sms"] or get_device_num_sms()
