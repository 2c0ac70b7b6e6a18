"""LocalStack provider plugin that answers every ELBv2 operation from moto.

LocalStack's community edition has no ELBv2 provider. A provider is looked up
by the entry point group ``localstack.aws.provider`` under ``<api>:<name>``;
this package registers ``elbv2:default``. Its provider has one handler per
operation in botocore's elbv2 model, each raising NotImplementedError, and
``MotoFallbackDispatcher`` turns that into "let moto answer".
"""

from localstack.services.plugins import Service, aws_provider


def _provider_class():
    import botocore.session
    from localstack.aws.api import handler

    model = botocore.session.get_session().get_service_model("elbv2")

    def make(op):
        def fallthrough(self, context, request):
            raise NotImplementedError(op)

        fallthrough.__name__ = op
        fallthrough.__qualname__ = f"Elbv2Provider.{op}"
        return handler(op, expand=False)(fallthrough)

    attrs = {"service": "elbv2", "version": model.api_version}
    for op in model.operation_names:
        attrs[op] = make(op)
    return type("Elbv2Provider", (object,), attrs)


@aws_provider(api="elbv2")
def elbv2():
    from localstack.services.moto import MotoFallbackDispatcher

    provider = _provider_class()()
    return Service.for_provider(provider, dispatch_table_factory=MotoFallbackDispatcher)

