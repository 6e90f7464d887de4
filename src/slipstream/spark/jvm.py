"""JVM classes and static methods the driver calls every epoch, found without a walk.

py4j resolves ``sc._jvm.org.apache.spark.HashPartitioner`` one name segment per round
trip: ``org``, ``org.apache``, ``org.apache.spark`` are each a failed class lookup on the
JVM (a search of every jar on the classpath) before the class is found, and a short name
such as ``jvm.PythonRDD`` tries PySpark's wildcard imports one failed lookup at a time.
A static method (``Arrays.toString``) is one more round trip to learn it is a method.
At ~40 such lookups an epoch they were a few ms of the driver's round trips and of the
JVM's CPU (docs/performance.md, "Fixed cost per epoch: the driver's class lookups").

:func:`jvm_class` names a class by its full name (no round trip: the JVM loads it by that
name at the first call, once) and :func:`jvm_static` looks a static method up once per
SparkContext.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["jvm_class", "jvm_static"]

_lock = threading.Lock()
#: per SparkContext: ``(class name, method name) -> py4j JavaMember``
_statics: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()


def jvm_class(sc: Any, fqn: str) -> Any:
    """The py4j ``JavaClass`` ``fqn`` (a full name, ``$`` before a nested class) of
    ``sc``'s JVM, without a round trip: calling it constructs an instance, and it can
    type a ``gateway.new_array``."""
    from py4j.java_gateway import JavaClass

    return JavaClass(fqn, sc._gateway._gateway_client)


def jvm_static(sc: Any, fqn: str, name: str) -> Any:
    """The static method ``name`` of class ``fqn`` in ``sc``'s JVM, looked up once per
    SparkContext (each later call is one round trip)."""
    with _lock:
        known = _statics.get(sc)
        method = known.get((fqn, name)) if known is not None else None
    if method is not None:
        return method
    method = getattr(jvm_class(sc, fqn), name)
    with _lock:
        _statics.setdefault(sc, {})[(fqn, name)] = method
    return method
