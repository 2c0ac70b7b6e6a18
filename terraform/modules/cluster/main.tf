# A Flotilla cluster on its own network, as the terraform-aws-modules/eks module builds one:
# a VPC with a public and a private subnet in each of two zones, an internet gateway, a NAT
# gateway and route tables (hashicorp/aws), a security group for the nodes, the cluster on the private subnets,
# and one node pool (../node-pool).

terraform {
  required_providers {
    aws      = { source = "hashicorp/aws" }
    flotilla = { source = "flotilla/flotilla" }
  }
}

variable "name" {
  description = "The cluster's name (also the network's Name tags)."
  type        = string
}

variable "kubernetes_version" {
  description = "Kubernetes minor version (default: the newest the service supports)."
  type        = string
  default     = null
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "availability_zones" {
  type    = list(string)
  default = ["us-east-1a", "us-east-1b"]
}

variable "vpc_cidr" {
  type    = string
  default = "10.0.0.0/16"
}

variable "cloud_endpoint" {
  description = "One endpoint for every cloud API the cluster calls (LocalStack's); null: the region's."
  type        = string
  default     = null
}

variable "access_key_id" {
  description = "Static credentials the cluster's cloud controller uses (null: its default chain)."
  type        = string
  default     = null
}

variable "secret_access_key" {
  type      = string
  default   = null
  sensitive = true
}

variable "instance_types" {
  type    = list(string)
  default = ["t3.medium"]
}

variable "node_count" {
  description = "Nodes of the default pool."
  type        = number
  default     = 2
}

variable "tags" {
  type    = map(string)
  default = {}
}

variable "enable_nat_gateway" {
  description = "A NAT gateway for the private subnets, where the nodes are (they need a way out to the service's endpoint and to image registries unless the VPC has other routes)."
  type        = bool
  default     = true
}

variable "enable_dns_hostnames" {
  description = "Public DNS hostnames for the VPC's instances. Nothing of Flotilla uses them (nodes sit in the private subnets, the cluster's endpoint is the service's), and hashicorp/aws waits a fixed 10 s after setting it, so it is off unless asked for."
  type        = bool
  default     = false
}

resource "aws_vpc" "this" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = var.enable_dns_hostnames
  tags                 = merge(var.tags, { Name = var.name })
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id
  tags   = merge(var.tags, { Name = var.name })
}

resource "aws_subnet" "public" {
  count             = length(var.availability_zones)
  vpc_id            = aws_vpc.this.id
  availability_zone = var.availability_zones[count.index]
  cidr_block        = cidrsubnet(var.vpc_cidr, 8, count.index)
  # Only internet-facing load balancers go here (the cloud controller's subnet discovery), so
  # instances get no public address by default, as in terraform-aws-modules/vpc (and setting
  # it costs a fixed 10 s wait in hashicorp/aws).
  map_public_ip_on_launch = false
  tags                    = merge(var.tags, { Name = "${var.name}-public-${count.index}", "kubernetes.io/role/elb" = "1" })
}

resource "aws_subnet" "private" {
  count             = length(var.availability_zones)
  vpc_id            = aws_vpc.this.id
  availability_zone = var.availability_zones[count.index]
  cidr_block        = cidrsubnet(var.vpc_cidr, 8, 10 + count.index)
  tags              = merge(var.tags, { Name = "${var.name}-private-${count.index}", "kubernetes.io/role/internal-elb" = "1" })
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this.id
  }
  tags = merge(var.tags, { Name = "${var.name}-public" })
}

resource "aws_route_table_association" "public" {
  count          = length(aws_subnet.public)
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.this.id
  tags   = merge(var.tags, { Name = "${var.name}-private" })
}

# The private subnets' way out (the nodes reach the service's endpoint and image registries
# through it): one NAT gateway in the first public subnet, as terraform-aws-modules/vpc's
# `single_nat_gateway`.
resource "aws_eip" "nat" {
  count  = var.enable_nat_gateway ? 1 : 0
  domain = "vpc"
  tags   = merge(var.tags, { Name = "${var.name}-nat" })
}

resource "aws_nat_gateway" "this" {
  count         = var.enable_nat_gateway ? 1 : 0
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
  tags          = merge(var.tags, { Name = var.name })
  depends_on    = [aws_internet_gateway.this]
}

resource "aws_route" "private_out" {
  count                  = var.enable_nat_gateway ? 1 : 0
  route_table_id         = aws_route_table.private.id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.this[0].id
}

resource "aws_route_table_association" "private" {
  count          = length(aws_subnet.private)
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

resource "aws_security_group" "nodes" {
  name        = "${var.name}-nodes"
  description = "The cluster's nodes: each other, and out anywhere"
  vpc_id      = aws_vpc.this.id
  ingress {
    from_port = 0
    to_port   = 0
    protocol  = "-1"
    self      = true
  }
  egress {
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
  tags = merge(var.tags, { Name = "${var.name}-nodes" })
}

resource "flotilla_cluster" "this" {
  name    = var.name
  version = var.kubernetes_version
  tags    = var.tags
  cloud {
    region             = var.region
    endpoint_override  = var.cloud_endpoint
    vpc_id             = aws_vpc.this.id
    subnet_ids         = aws_subnet.private[*].id
    security_group_ids = [aws_security_group.nodes.id]
    access_key_id      = var.access_key_id
    secret_access_key  = var.secret_access_key
  }
}

module "default_pool" {
  source         = "../node-pool"
  cluster_name   = flotilla_cluster.this.name
  name           = "default"
  instance_types = var.instance_types
  desired_size   = var.node_count
  max_size       = max(3, var.node_count)
}

# A kubeconfig that stays the same from plan to plan: kubectl asks `flotilla cluster token`
# for a short-lived token on each use (as EKS's kubeconfigs call `aws eks get-token`); the
# flotilla CLI finds the service from FLOTILLA_CONFIG or its flags. (`data.flotilla_kubeconfig`
# gives a client certificate instead, issued anew on every read.)
locals {
  kubeconfig = yamlencode({
    apiVersion = "v1"
    kind       = "Config"
    clusters = [{
      name = var.name
      cluster = {
        server                       = flotilla_cluster.this.endpoint
        "certificate-authority-data" = flotilla_cluster.this.certificate_authority
      }
    }]
    users = [{
      name = var.name
      user = {
        exec = {
          apiVersion      = "client.authentication.k8s.io/v1"
          command         = "flotilla"
          args            = ["cluster", "token", var.name]
          interactiveMode = "Never"
        }
      }
    }]
    contexts          = [{ name = var.name, context = { cluster = var.name, user = var.name } }]
    "current-context" = var.name
  })
}

output "cluster_name" {
  value = flotilla_cluster.this.name
}

output "cluster_arn" {
  value = flotilla_cluster.this.arn
}

output "endpoint" {
  value = flotilla_cluster.this.endpoint
}

output "certificate_authority" {
  value = flotilla_cluster.this.certificate_authority
}

output "oidc_issuer" {
  value = flotilla_cluster.this.oidc_issuer
}

output "vpc_id" {
  value = aws_vpc.this.id
}

output "private_subnet_ids" {
  value = aws_subnet.private[*].id
}

output "kubeconfig" {
  description = "A kubeconfig whose credential comes from `flotilla cluster token` on each use."
  value       = local.kubeconfig
}
