"""The image catalog: AMI ids that roost knows, and what a node runs for each.

An image names an interpreter for the instance's user data. With no user data, the
instance idles until it is stopped or terminated, like a booted machine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Image:
    image_id: str
    name: str
    description: str
    interpreter: str  # "sh" or "python": how the node runs the user data


IMAGES: dict[str, Image] = {
    img.image_id: img
    for img in (
        Image("ami-00000000000000001", "roost-shell", "User data runs under /bin/sh.", "sh"),
        Image(
            "ami-00000000000000002",
            "roost-python",
            "User data runs under the node's Python interpreter.",
            "python",
        ),
    )
}
DEFAULT_IMAGE_ID = "ami-00000000000000001"
