"""The bus principals: who may publish and subscribe to what (`table`), what each worker's
rules publish (`senders`, the workers' `grants.py` handed over by the registry), and the
nats-server configuration and docs table made of them (`config`)."""

from workers.runtime.bus.principals.config import grants_of as grants_of
from workers.runtime.bus.principals.config import markdown as markdown
from workers.runtime.bus.principals.config import render as render
from workers.runtime.bus.principals.config import rewrite_doc as rewrite_doc
from workers.runtime.bus.principals.config import write as write
from workers.runtime.bus.principals.senders import EMITS as EMITS
from workers.runtime.bus.principals.senders import EMITTED_TYPES as EMITTED_TYPES
from workers.runtime.bus.principals.senders import NotEmitted as NotEmitted
from workers.runtime.bus.principals.senders import dead_publishers as dead_publishers
from workers.runtime.bus.principals.senders import emitted as emitted
from workers.runtime.bus.principals.senders import install as install
from workers.runtime.bus.principals.senders import matches as matches
from workers.runtime.bus.principals.senders import refusal as refusal
from workers.runtime.bus.principals.table import INBOX as INBOX
from workers.runtime.bus.principals.table import INBOX_PLACEHOLDER as INBOX_PLACEHOLDER
from workers.runtime.bus.principals.table import Principal as Principal
from workers.runtime.bus.principals.table import check_gateways as check_gateways
from workers.runtime.bus.principals.table import check_subscribers as check_subscribers
from workers.runtime.bus.principals.table import gateway_durable as gateway_durable
from workers.runtime.bus.principals.table import inbox_prefix as inbox_prefix
from workers.runtime.bus.principals.table import principals as principals
from workers.runtime.bus.principals.table import relay_streams as relay_streams
from workers.runtime.bus.principals.table import subscriber_durable as subscriber_durable
from workers.runtime.bus.seeds import SeedFileError as SeedFileError  # `bcw auth nats`'s
from workers.runtime.bus.seeds import public_key as public_key
