"""The base of a saved result's typed parts: named fields typed, any other key kept as it was,
and the JSON object it was read from (or built from: a runner's keyword arguments, then what it
set) given back with its keys in their order."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, PrivateAttr, model_validator
from typing_extensions import Self


class Open(BaseModel):
    """Named fields typed; any other key kept as it is; the keys' order remembered."""

    model_config = ConfigDict(extra="allow")

    _keys: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        model = handler(data)
        if isinstance(data, dict) and model is not data:
            model._keys = list(data)
        return model

    def __setattr__(self, name: str, value: Any) -> None:
        """Set a field or a kept key; a key it did not have goes after the others."""
        super().__setattr__(name, value)
        if not name.startswith("_") and self._keys and name not in self._keys:
            self._keys.append(name)

    def put(self, key: str, value: Any) -> None:
        """Set a key that no field names (kept as it is)."""
        setattr(self, key, value)

    def given(self) -> list[str]:
        """The keys it was read from (or built with), in their order."""
        return self._keys or list(self.model_dump(exclude_unset=True))

    def value(self, key: str) -> Any:
        """A named field's value or a kept key's; None for a key neither names."""
        extra = self.__pydantic_extra__ or {}
        if key in extra:
            return extra[key]
        return getattr(self, key) if key in type(self).model_fields else None

    def document(self) -> dict[str, Any]:
        """The JSON object this was read from: the keys it had, in their order, none added
        (values as typed: an int stays an int)."""
        return {k: plain(self.value(k)) for k in self.given()}


def plain(value: Any) -> Any:
    """A value as JSON holds it: typed parts as their documents, the rest as it is."""
    if isinstance(value, Open):
        return value.document()
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
