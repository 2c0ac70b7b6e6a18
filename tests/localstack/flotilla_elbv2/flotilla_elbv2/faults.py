"""Fault injection for LocalStack's community edition.

The subset of LocalStack Pro's Chaos API (``/_localstack/chaos/faults``) that
Flotilla's tests need, with the same JSON shape::

    [{"service": "ec2", "operation": "RunInstances", "region": "us-east-1",
      "probability": 1.0, "error": {"statusCode": 503, "code": "Unavailable"}}]

Every field is optional; a rule with no service/operation/region matches every
AWS request (default error: 503 ServiceUnavailable). GET lists the rules, POST
replaces them, PATCH adds to them, DELETE removes the given ones (all of them
when the body is ``[]`` or empty). Only AWS requests are affected, never
``/_localstack/*``. Registered as an ``on_infra_start`` hook.
"""

from localstack.runtime import hooks

_FAULTS: list = []


def _matches(rule, context) -> bool:
    service = context.service.service_name if context.service else None
    operation = context.operation.name if context.operation else None
    for key, value in (("service", service), ("operation", operation), ("region", context.region)):
        if rule.get(key) not in (None, "", value):
            return False
    return True


def _fault_handler(chain, context, response):
    if not _FAULTS or context.service is None:
        return
    import random

    from localstack.aws.api import CommonServiceException

    for rule in list(_FAULTS):
        if _matches(rule, context) and random.random() < float(rule.get("probability", 1.0)):
            error = rule.get("error") or {}
            raise CommonServiceException(
                code=error.get("code", "ServiceUnavailable"),
                message=error.get("message", "Failing as per Fault Injection Simulator configuration"),
                status_code=int(error.get("statusCode", 503)),
            )


class _FaultsResource:
    @staticmethod
    def _rules(request):
        data = request.get_data()
        rules = __import__("json").loads(data) if data.strip() else []
        if isinstance(rules, dict):
            rules = [rules]
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise ValueError("expected a JSON list of fault rules")
        return rules

    def _answer(self):
        from localstack.http import Response

        return Response.for_json(list(_FAULTS))

    def on_get(self, request):
        return self._answer()

    def on_post(self, request):
        _FAULTS[:] = self._rules(request)
        return self._answer()

    def on_patch(self, request):
        _FAULTS.extend(self._rules(request))
        return self._answer()

    def on_delete(self, request):
        rules = self._rules(request)
        _FAULTS[:] = [r for r in _FAULTS if rules and r not in rules]
        return self._answer()


@hooks.on_infra_start()
def register_fault_injection():
    from localstack.aws import handlers
    from localstack.http import Resource
    from localstack.services.internal import get_internal_apis

    get_internal_apis().add(Resource("/_localstack/chaos/faults", _FaultsResource()))
    handlers.serve_custom_service_request_handlers.append(_fault_handler)
